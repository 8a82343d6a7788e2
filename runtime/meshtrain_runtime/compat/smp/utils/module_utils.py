"""``torch.sagemaker.utils.module_utils``: helpers for custom delayed-init functions."""

from __future__ import annotations

import torch
from torch import nn


def empty_module_params(
    module: nn.Module, device: torch.device | None = None, recurse: bool = False
) -> nn.Module:
    """Allocate (uninitialised) storage for `module`'s parameters on `device`."""
    if device is None:
        from meshtrain_runtime import state

        device = state.current().device
    return module.to_empty(device=device, recurse=recurse)


def move_buffers_to_device(
    module: nn.Module, device: torch.device | None = None, recurse: bool = False
) -> nn.Module:
    """Move `module`'s buffers (not its parameters) to `device`."""
    if device is None:
        from meshtrain_runtime import state

        device = state.current().device
    for sub in module.modules() if recurse else [module]:
        for name, buffer in list(sub.named_buffers(recurse=False)):
            if buffer is not None:
                setattr(sub, name, buffer.to(device))
    return module


__all__ = ["empty_module_params", "move_buffers_to_device"]
