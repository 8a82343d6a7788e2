"""Model layers meshtrain provides (the MoE layer and its grouped experts)."""
