"""`compile: true`: per-block ``torch.compile``, as torchtitan places it in the transform order.

Each transformer block is compiled in place (``nn.Module.compile``: the module, its name and its
parameters stay the same, so FSDP grouping, checkpoints and state-dict keys are unchanged),
after tensor / expert parallelism and activation checkpointing (the compiled region contains
the block's TP/EP layout and its checkpoint) and before FSDP2 (FSDP's hooks are skipped by
dynamo and run eagerly around each compiled block, so its all-gathers and reduce-scatters keep
overlapping as without compile). Compilation is lazy: the first forward and backward pay for
it; `CompileTimer` logs that first step's time once on stderr.

Tensor parallelism: torch's TP styles end a region with an asynchronous collective
(``redistribute(..., async_op=True)`` then ``to_local()``), so the vocab-parallel embedding
hands the first block an ``AsyncCollectiveTensor``. Given such an input, the backward of the
embedding's ``Redistribute`` (behind the compiled block) receives a plain-tensor gradient
where it needs a DTensor (torch 2.13: ``AttributeError: 'Tensor' object has no attribute
'_local_tensor'`` in ``NestedRedistribute.forward``; measured with TP alone, not with
FSDP2 over the blocks as well). Each compiled block therefore waits for
such inputs first (a copy; eager, before the compiled code), as `_plain_collective_inputs` does.
"""

from __future__ import annotations

import shutil
import sys
import time
from collections.abc import Callable, Sequence
from typing import Any

from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.torch_api import AsyncCollectiveTensor, tree_map, wrap_compiled_call

_CXX = ("c++", "g++", "clang++")


def check_compile(
    *,
    blocks: Sequence[nn.Module],
    device_type: str,
    activation_offloading: bool,
    activation_checkpointing: bool | str = False,
    tensor_parallel_degree: int = 1,
    expert_parallel_degree: int = 1,
) -> None:
    """ConfigError where per-block compile cannot apply; called before the model is touched."""
    if not blocks:
        raise ConfigError(
            "compile=True compiles each transformer block, but no blocks were found. Pass them, "
            "e.g. transform(model, blocks=list(model.layers)), or set compile=False."
        )
    if tensor_parallel_degree > 1 and activation_checkpointing:
        raise ConfigError(
            f"compile=True with tensor_parallel_degree={tensor_parallel_degree} and "
            f"activation_checkpointing={activation_checkpointing!r}: inside a checkpointed "
            "block dynamo refuses the "
            "side effect of the tensor-parallel norms (their replicated weights are swapped "
            "for local tensors: 'HOP: Unsafe side effect ... Attempted to mutate "
            "DunderDictVariable'), so the whole block would run eagerly and compile would do "
            "nothing; allowing it (torch._dynamo.config."
            "skip_fwd_side_effects_in_bwd_under_checkpoint) fails in AOTAutograd on torch 2.13 "
            "('expected all tensors_saved_with_vc_check to be Tensors': a DeviceMesh is "
            "saved). Set activation_checkpointing=False (compile then covers the whole "
            "tensor-parallel block) or compile=False."
        )
    if expert_parallel_degree > 1 and activation_checkpointing:
        raise ConfigError(
            f"compile=True with expert_parallel_degree={expert_parallel_degree} and "
            f"activation_checkpointing={activation_checkpointing!r}: the expert all-to-all has "
            "data-dependent sizes, "
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
        wrap_compiled_call(block, _plain_collective_inputs)
    CompileTimer(len(blocks)).attach(model)
    return model


def _wait(value: Any) -> Any:
    # clone() goes through AsyncCollectiveTensor's dispatch (wait, unwrap) and through autograd,
    # so the gradient still reaches the to_local() that produced the input.
    return value.clone() if isinstance(value, AsyncCollectiveTensor) else value


def _plain_collective_inputs(compiled: Callable[..., Any]) -> Callable[..., Any]:
    """`compiled` (a block's compiled call), called with every pending-collective tensor among
    its inputs replaced by a plain copy (see the module docstring: TP's embedding output)."""

    def call(*args: Any, **kwargs: Any) -> Any:
        return compiled(*tree_map(_wait, args), **tree_map(_wait, kwargs))

    return call


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
