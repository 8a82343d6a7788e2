"""`compile: true`: per-block ``torch.compile``, as torchtitan places it in the transform order.

Each transformer block is compiled in place (``nn.Module.compile``: the module, its name and its
parameters stay the same, so FSDP grouping, checkpoints and state-dict keys are unchanged),
after tensor / expert parallelism and activation checkpointing (the compiled region contains
the block's TP/EP layout and its checkpoint) and before FSDP2 (FSDP's hooks are skipped by
dynamo and run eagerly around each compiled block, so its all-gathers and reduce-scatters keep
overlapping as without compile). Compilation is lazy: the first forward and backward pay for
it; `CompileTimer` logs that first step's time once on stderr.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Sequence
from typing import Any

from torch import nn

from meshtrain.contract.errors import ConfigError

_CXX = ("c++", "g++", "clang++")


def check_compile(
    *,
    blocks: Sequence[nn.Module],
    device_type: str,
    activation_offloading: bool,
    activation_checkpointing: bool = False,
    tensor_parallel_degree: int = 1,
    expert_parallel_degree: int = 1,
) -> None:
    """ConfigError where per-block compile cannot apply; called before the model is touched."""
    if not blocks:
        raise ConfigError(
            "compile=True compiles each transformer block, but no blocks were found. Pass them, "
            "e.g. transform(model, blocks=list(model.layers)), or set compile=False."
        )
    if tensor_parallel_degree > 1:
        raise ConfigError(
            f"compile=True with tensor_parallel_degree={tensor_parallel_degree}: compiled "
            "tensor-parallel blocks fail in backward in this build (DTensor's redistribute "
            "backward receives a plain tensor; measured with torch 2.13 on gloo), and under "
            "activation checkpointing dynamo falls back to eager for the whole block. Set "
            "compile=False, or tensor_parallel_degree=1."
        )
    if expert_parallel_degree > 1 and activation_checkpointing:
        raise ConfigError(
            f"compile=True with expert_parallel_degree={expert_parallel_degree} and "
            "activation_checkpointing=True: the expert all-to-all has data-dependent sizes, "
            "which break the compiled graph, and a graph break inside a checkpointed block "
            "makes torch.compile run the whole block eagerly, so compile would do nothing. "
            "Set activation_checkpointing=False (compile then covers the blocks' dense parts) "
            "or compile=False."
        )
    if activation_offloading:
        raise ConfigError(
            "compile=True with activation_offloading=True: the offloader moves every saved "
            "tensor through saved-tensor hooks and side streams, which torch.compile cannot "
            "place inside a compiled block; meshtrain does not combine them. Set one of them "
            "to False (compile with activation_checkpointing alone is supported)."
        )
    if device_type == "cpu" and not any(shutil.which(name) for name in _CXX):
        raise ConfigError(
            "compile=True on CPU: torch.compile's inductor backend generates C++ and needs a "
            f"C++ compiler ({', '.join(_CXX)}), none of which is on PATH. Install one (e.g. "
            "the g++ package of your OS) or set compile=False."
        )
    if device_type == "cuda":
        try:
            import triton  # noqa: F401
        except ImportError:
            raise ConfigError(
                "compile=True on CUDA: torch.compile's inductor backend generates Triton "
                "kernels, but triton is not installed. Install the triton build matching "
                "your torch, or set compile=False."
            ) from None


def apply_compile(
    model: nn.Module, blocks: Sequence[nn.Module], *, backend: str = "inductor"
) -> nn.Module:
    """Compile every block in place; attach a `CompileTimer` to `model`. Returns `model`."""
    for block in blocks:
        block.compile(backend=backend)
    CompileTimer(len(blocks)).attach(model)
    return model


class CompileTimer:
    """Logs the first training step's wall time (it includes compiling the blocks), once.

    The step is measured from the start of the first forward to the start of the second one
    (forward, backward and optimizer step); the first forward alone is logged too.
    """

    def __init__(self, num_blocks: int) -> None:
        self.num_blocks = num_blocks
        self.calls = 0
        self.start = 0.0
        self.forward_s: float | None = None
        self.first_step_s: float | None = None
        self._handles: list[Any] = []

    def attach(self, model: nn.Module) -> None:
        self._handles = [
            model.register_forward_pre_hook(self._pre),
            model.register_forward_hook(self._post),
        ]

    def _pre(self, _module: nn.Module, _args: Any) -> None:
        self.calls += 1
        if self.calls == 1:
            self.start = time.perf_counter()
        else:
            step_s = self.first_step_s = time.perf_counter() - self.start
            print(
                f"meshtrain: compile=True: first step {step_s:.1f} s (first forward "
                f"{self.forward_s or 0.0:.1f} s), including compiling {self.num_blocks} "
                "blocks; later steps reuse the compiled code",
                file=sys.stderr, flush=True,
            )
            for handle in self._handles:
                handle.remove()

    def _post(self, _module: nn.Module, _args: Any, _output: Any) -> None:
        if self.calls == 1 and self.forward_s is None:
            self.forward_s = time.perf_counter() - self.start


__all__ = ["CompileTimer", "apply_compile", "check_compile"]
