"""Context parallelism: exact attention over sequences split across the ranks of a cp group.

- ``context_attention(q, k, v, *, group, comm_type, is_causal, scale, layout)``: local chunks
  in, this rank's slice of full-sequence attention out (p2p ring, all_gather, a2a/Ulysses).
- ``context_parallel_shard(*tensors, seq_dim, cp_rank, cp_size, layout)`` and
  ``context_parallel_unshard(tensor, seq_dim, group, layout)``: the split into a rank's chunks
  (SMP v2's load-balanced layout by default) and back.
- ``sdpa_dispatch(group, comm_type, layout)``: a mode under which every
  ``F.scaled_dot_product_attention`` call runs as ``context_attention``.
"""

from meshtrain_runtime.parallel.context.attention import COMM_TYPES, context_attention
from meshtrain_runtime.parallel.context.dispatch import sdpa_dispatch
from meshtrain_runtime.parallel.context.layout import (
    LAYOUTS,
    context_parallel_shard,
    context_parallel_unshard,
    local_positions,
)

__all__ = [
    "COMM_TYPES",
    "LAYOUTS",
    "context_attention",
    "context_parallel_shard",
    "context_parallel_unshard",
    "local_positions",
    "sdpa_dispatch",
]
