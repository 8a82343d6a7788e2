"""The full, unsharded model state dict for serving: one file on rank 0, HF names and config.

``export_full_state_dict`` gathers the sharded model (FSDP2, TP, EP DTensors) with torch's
``get_model_state_dict(full_state_dict=True, cpu_offload=True)`` and writes it with safetensors
when installed, else ``torch.save``. A pipelined model (`PipelineModule`) holds only this rank's
stages: each stage is gathered within its own ranks, then rank 0 collects the other stages over
its pipeline group, so the file is the unsplit model's full state dict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.checkpoint.base import PathLike, barrier, check_local_path, rank
from meshtrain_runtime.parallel.pipeline import PipelineModule


def export_full_state_dict(model: nn.Module, path: PathLike) -> Path | None:
    """Write the full, unsharded model state dict on rank 0 for serving; call on every rank.

    The keys are the model's own (for a Hugging Face model its HF names, so
    ``from_pretrained`` reads it). `path` is a file, or a directory (then ``model.safetensors``
    or ``pytorch_model.bin`` inside, plus the HF ``config.json`` when the model has one).
    Uses safetensors when it is installed, else ``torch.save``. Returns the file on rank 0,
    None on the other ranks.
    """
    check_local_path(path)
    target = Path(path)
    if isinstance(model, PipelineModule):
        full = _gather_pipeline_stages(model)
    else:
        options = StateDictOptions(full_state_dict=True, cpu_offload=True)
        full = get_model_state_dict(model, options=options)  # collective: gathers to rank 0
    written = None
    if rank() == 0:
        written = _write_full(full, target, getattr(model, "config", None))
    barrier()
    return written



# --- helpers ---


def _gather_pipeline_stages(model: PipelineModule) -> dict[str, torch.Tensor]:
    """The whole model's full state dict on rank 0 ({} elsewhere): every rank gathers its
    stages' shards (over their data-parallel / TP ranks), then the pipeline group that holds
    rank 0 sends its stages to rank 0 (the other pipelines hold the same weights)."""
    # not cpu_offload: that keeps the gathered tensors on global rank 0 only, which holds
    # the first stage alone
    options = StateDictOptions(full_state_dict=True)
    local = {name: tensor.detach().cpu()
             for name, tensor in get_model_state_dict(model, options=options).items()}
    st = runtime_state.current()
    group = st.pp_process_group
    if dist.get_global_rank(group, 0) != 0:  # a pipeline that does not hold rank 0
        return {}
    stages: list[Any] = [None] * st.pp_size if rank() == 0 else None
    dist.gather_object(local, stages, group=group, group_dst=0)
    if rank() != 0:
        return {}
    full: dict[str, torch.Tensor] = {}
    for stage_state in stages:
        full.update(stage_state)
    return full


def _write_full(state: dict[str, torch.Tensor], target: Path, config: Any) -> Path:
    if target.is_dir() or not target.suffix:
        target.mkdir(parents=True, exist_ok=True)
        if config is not None and hasattr(config, "save_pretrained"):
            config.save_pretrained(target)
        target = target / ("model.safetensors" if has_safetensors() else "pytorch_model.bin")
    target.parent.mkdir(parents=True, exist_ok=True)
    tensors = unshared_tensors(state)
    if target.suffix == ".safetensors":
        if not has_safetensors():
            raise ConfigError(f"{target} asks for safetensors, which is not installed: "
                              "`pip install safetensors` or use a .bin / .pt file name.")
        from safetensors.torch import save_file

        save_file(tensors, str(target), metadata={"format": "pt"})
    else:
        torch.save(tensors, target)
    return target


def unshared_tensors(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Contiguous tensors, tied weights copied apart (safetensors refuses shared storage)."""
    seen: set[int] = set()
    out = {}
    for name, tensor in state.items():
        tensor = tensor.detach().contiguous()
        pointer = tensor.untyped_storage().data_ptr()
        out[name] = tensor.clone() if pointer in seen else tensor
        seen.add(pointer)
    return out


def has_safetensors() -> bool:
    try:
        import safetensors.torch  # noqa: F401
    except ImportError:
        return False
    return True



__all__ = ["export_full_state_dict"]
