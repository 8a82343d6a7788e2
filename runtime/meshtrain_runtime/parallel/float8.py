"""`fp8: true`: torchao's float8 training, a model converter applied before any parallelism.

Every ``nn.Linear`` inside the transformer blocks whose in and out features are multiples of 16
(the alignment float8 matmuls need) becomes torchao's ``Float8Linear``: tensorwise dynamic
scaling, inputs and weights cast to e4m3 and output gradients to e5m2 for the matmuls, with
parameters, gradients and optimizer state left in their own precision. Linears outside the
blocks stay as they are: the output head, whose logits feed the loss (torchtitan's choice too).
So do MoE expert weights (grouped, not ``nn.Linear``) and narrow routers.

When FSDP2 shards the weights (shard degree > 1) they are cast to float8 before the all-gather
(torchao's ``enable_fsdp_float8_all_gather``): half the bytes of a bf16 all-gather, and each
weight's scale comes from the amax of the whole weight, as without sharding.
``torchao.float8.precompute_float8_dynamic_scale_for_fsdp(model)`` after ``optimizer.step()``
is an optional saving the script may add (one all-reduce for every scale instead of one each).

Where it cannot run, ``check_fp8`` refuses before the model is touched: a device without float8
tensor cores (anything but CUDA of compute capability 9.0+, H100 class), or no torchao. Tensor
parallelism is refused in the contract (``check_build_support``): it would need torchao's float8
TP styles.
"""

from __future__ import annotations

import importlib.util
from collections.abc import Sequence

import torch
from torch import nn

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.support import check_fp8_device

FLOAT8_ALIGNMENT = 16  # float8 matmuls need both dims of each operand divisible by 16


def check_fp8(enabled: bool, device: torch.device) -> None:
    """ConfigError unless this process can train with float8 matmuls (see the module doc)."""
    if not enabled:
        return
    check_fp8_device(enabled, device.type)  # the client runs it too, for local jobs
    major, minor = torch.cuda.get_device_capability(device)
    if (major, minor) < (9, 0):
        raise ConfigError(
            f"fp8=True needs float8 tensor cores (compute capability 9.0+, H100-class), but "
            f"{torch.cuda.get_device_name(device)} has compute capability {major}.{minor}. "
            "Set fp8=False and use mixed_precision='bf16'."
        )
    if importlib.util.find_spec("torchao") is None:
        raise ConfigError(
            "fp8=True uses torchao's float8 training, but torchao is not installed. Install "
            "it (pip install 'meshtrain[fp8]', or the torchao release matching your torch), or "
            "set fp8=False."
        )


def float8_linears(model: nn.Module, blocks: Sequence[nn.Module]) -> list[str]:
    """Names of the linears `apply_float8` converts: inside `blocks`, both dims aligned."""
    inside = {id(module) for block in blocks for module in block.modules()}
    return [name for name, module in model.named_modules()
            if id(module) in inside and _aligned_linear(module)]


def _aligned_linear(module: nn.Module) -> bool:
    return (isinstance(module, nn.Linear) and module.in_features % FLOAT8_ALIGNMENT == 0
            and module.out_features % FLOAT8_ALIGNMENT == 0)


def apply_float8(model: nn.Module, blocks: Sequence[nn.Module], *,
                 fsdp_float8_all_gather: bool) -> list[str]:
    """Swap the eligible linears of `blocks` for torchao's Float8Linear, in place; return their
    names. A ConfigError, with nothing changed, when no linear is eligible."""
    names = float8_linears(model, blocks)
    if not names:
        raise ConfigError(
            f"fp8=True converts the nn.Linear layers inside the transformer blocks whose in and "
            f"out features are multiples of {FLOAT8_ALIGNMENT}, but {type(model).__name__} has "
            f"none ({len(blocks)} block(s) found). Set fp8=False, or pass the blocks that hold "
            "the model's linear layers with transform(model, blocks=...)."
        )
    from meshtrain_runtime.host.import_noise import quiet_torchao_import

    quiet_torchao_import()  # a script run outside a job: see host/import_noise.py
    from torchao.float8 import Float8LinearConfig, convert_to_float8_training

    chosen = set(names)
    convert_to_float8_training(
        model,
        config=Float8LinearConfig(enable_fsdp_float8_all_gather=fsdp_float8_all_gather),
        module_filter_fn=lambda _module, name: name in chosen,
    )
    return names


__all__ = ["FLOAT8_ALIGNMENT", "apply_float8", "check_fp8", "float8_linears"]
