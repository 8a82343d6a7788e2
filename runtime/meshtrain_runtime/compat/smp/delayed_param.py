"""``torch.sagemaker.delayed_param.DelayedParamIniter``: FSDP1 ``param_init_fn`` for meta models.

FSDP1 calls ``param_init_fn(module)`` for every module that still has meta tensors, innermost
first, before sharding. The function allocates the module's own tensors on the runtime's device
and initialises them with the model's own rule (Hugging Face ``_init_weights`` of the root
model, else ``reset_parameters``), or with `init_method_using_config(module)`. Expert-parallel
experts (which Hugging Face's rule does not know) use their own ``reset_parameters``.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator

import torch
from torch import nn

from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.parallel.expert import ExpertParallelExperts


class DelayedParamIniter:
    """SMP's delayed initialiser: FSDP1's ``param_init_fn`` and ``post_param_init_fn``."""

    def __init__(
        self,
        model: nn.Module,
        init_method_using_config: Callable[[nn.Module], None] | None = None,
        verbose: bool = False,
    ) -> None:
        self.model = model
        self.init_method_using_config = init_method_using_config
        self.verbose = verbose
        self._initialised: set[int] = set()
        self.num_params = self.count_num_params(model)

    @staticmethod
    def count_num_params(module: nn.Module, *args: object) -> int:
        """Number of parameter elements (meta tensors count their shape)."""
        return sum(p.numel() for p in module.parameters())

    def _init_own(self, module: nn.Module) -> None:
        with torch.no_grad():
            if isinstance(module, ExpertParallelExperts):
                module.reset_parameters()  # EP's own experts: Hugging Face's rule skips them
            elif self.init_method_using_config is not None:
                self.init_method_using_config(module)
            elif callable(getattr(self.model, "_init_weights", None)):
                self.model._init_weights(module)
            elif hasattr(module, "reset_parameters"):
                module.reset_parameters()

    def get_param_init_fn(self) -> Callable[[nn.Module], None]:
        """FSDP ``param_init_fn``: materialise and initialise every module under the given one."""
        device = runtime_state.current().device

        def param_init_fn(module: nn.Module) -> None:
            for sub in module.modules():
                own = [*sub.parameters(recurse=False), *sub.buffers(recurse=False)]
                if id(sub) in self._initialised or not any(t.is_meta for t in own):
                    continue
                sub.to_empty(device=device, recurse=False)
                self._init_own(sub)
                self._initialised.add(id(sub))
                for tensor in own:
                    self._initialised.add(id(tensor))

        return param_init_fn

    def get_post_param_init_fn(self) -> Callable[[nn.Module], None]:
        """FSDP ``post_param_init_fn``: re-tie weights (``tie_weights``) when the model has it."""

        def post_param_init_fn(module: nn.Module) -> None:
            tie = getattr(module, "tie_weights", None)
            if callable(tie):
                tie()

        return post_param_init_fn

    @contextlib.contextmanager
    def validate_params_and_buffers_inited(self, enabled: bool = True) -> Iterator[None]:
        """Raise AssertionError after the block if a tensor of the model is still on meta."""
        yield
        if not enabled:
            return
        left = [name for name, t in [*self.model.named_parameters(), *self.model.named_buffers()]
                if t.is_meta]
        if left:
            raise AssertionError(
                f"{len(left)} parameters/buffers are still on the meta device after FSDP "
                f"wrapping (first: {left[:3]}). Pass param_init_fn=initer.get_param_init_fn() "
                "to FSDP."
            )


__all__ = ["DelayedParamIniter"]
