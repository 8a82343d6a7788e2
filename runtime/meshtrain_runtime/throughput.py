"""FLOPs per token of a transformer and the peak FLOP/s of this device, for TFLOP/s and MFU.

Model FLOPs utilisation (MFU, PaLM appendix B) = achieved model FLOP/s per device / the device's
peak dense rate. Model FLOPs count what the model needs, not what recomputation adds: activation
checkpointing lowers MFU's denominator of useful work per second, as it should.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Any

from meshtrain.contract.accelerators import gpu_spec_for_device


@dataclass(frozen=True)
class FlopCounter:
    """Training FLOPs per token: 6·N (matmuls, forward + backward) + 12·L·h·s (attention)."""

    num_params: int
    num_layers: int
    hidden_size: int
    seq_len: int

    @property
    def per_token(self) -> int:
        return 6 * self.num_params + 12 * self.num_layers * self.hidden_size * self.seq_len

    @classmethod
    def build(cls, model: Any = None, *, seq_len: int, num_params: int | None = None,
              num_layers: int | None = None, hidden_size: int | None = None) -> FlopCounter:
        """Sizes given explicitly win; the rest come from the model (and its HF config)."""
        config = getattr(model, "config", None)
        if num_params is None:
            num_params = matmul_parameters(model)
        if num_layers is None:
            num_layers = _config_value(config, "num_hidden_layers", "n_layer", "num_layers")
        if hidden_size is None:
            hidden_size = _config_value(config, "hidden_size", "n_embd", "d_model")
        return cls(int(num_params), int(num_layers or 0), int(hidden_size or 0), int(seq_len))


def _config_value(config: Any, *names: str) -> int | None:
    for name in names:
        value = getattr(config, name, None)
        if isinstance(value, int):
            return value
    return None


def matmul_parameters(model: Any) -> int:
    """Parameters that take part in matmuls: all, less input embeddings not tied to an output.

    A lookup costs no FLOPs; a tied LM head reuses the embedding's weight in a matmul, so a
    weight shared with a Linear counts. DTensor parameters count their global size.
    """
    from torch import nn

    linear_weights = {id(m.weight) for m in model.modules() if isinstance(m, nn.Linear)}
    lookups = {id(m.weight) for m in model.modules() if isinstance(m, nn.Embedding)}
    seen: set[int] = set()
    total = 0
    for param in model.parameters():
        if id(param) in seen:
            continue
        seen.add(id(param))
        if id(param) in lookups and id(param) not in linear_weights:
            continue
        total += param.numel()
    return total


def peak_flops_per_device() -> float | None:
    """This process's CUDA device's dense bf16 peak in FLOP/s; None on CPU or an unknown GPU."""
    torch = sys.modules.get("torch")
    if torch is None or not torch.cuda.is_available():
        return None
    spec = gpu_spec_for_device(torch.cuda.get_device_name())
    return spec.peak_tflops * 1e12 if spec else None
