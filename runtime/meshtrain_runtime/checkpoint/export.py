"""A sharded checkpoint to a Hugging Face folder, in one process, without GPUs or a job.

``export_to_hf(checkpoint, out)`` reads the model part of a DCP checkpoint written by
``save_checkpoint`` on any layout (FSDP2, HSDP, TP, EP: DCP records every tensor's global shape,
so the full tensors are read straight from the shards) and writes ``out/config.json`` and
``out/model.safetensors``, which ``from_pretrained`` loads. meshtrain keeps the model's own
parameter names in every layout (expert parallelism splits HF's fused ``gate_up_proj`` /
``down_proj`` expert weights without renaming them), so the names are HF's as they are.

The HF config is the ``config.json`` that ``save_checkpoint`` keeps beside the checkpoint (for
models with a ``config``); a checkpoint without one needs `config`, a config.json of the same
architecture. Also a command, which ``meshtrain export`` starts (the client never imports
torch)::

    python -m meshtrain_runtime.checkpoint.export CHECKPOINT --hf OUT [--config config.json]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import warnings
from pathlib import Path

import torch
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.metadata import TensorStorageMetadata

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.checkpoint.base import PathLike
from meshtrain_runtime.checkpoint.full_export import has_safetensors, unshared_tensors
from meshtrain_runtime.checkpoint.sharded import MARKER_NAME, latest_checkpoint

HF_CONFIG = "config.json"
MODEL_PREFIX = "model."  # save_checkpoint stores {"model": ..., "optimizer": ...}


def resolve_checkpoint(path: PathLike) -> Path:
    """`path` itself when it holds a completed save, else the newest completed step under it."""
    directory = Path(path)
    if (directory / MARKER_NAME).is_file():
        return directory
    if directory.is_dir():
        newest = latest_checkpoint(directory)
        if newest is not None:
            return newest
    raise ConfigError(
        f"{str(directory)!r} holds no completed meshtrain checkpoint (no {MARKER_NAME} in it or "
        "in a step_<n> folder under it). Pass the folder save_checkpoint wrote, e.g. "
        f"{directory / 'step_00000100'}."
    )


def resolve_config(checkpoint: Path, config: PathLike | None) -> Path:
    """The HF config.json to export with: `config`, else the one save_checkpoint kept."""
    candidate = Path(config) if config is not None else checkpoint / HF_CONFIG
    if candidate.is_file():
        return candidate
    if config is not None:
        raise ConfigError(f"--config {str(candidate)!r} is not a file. Pass the model's "
                          "config.json (config.save_pretrained(folder) writes one).")
    raise ConfigError(
        f"{checkpoint} has no {HF_CONFIG}: save_checkpoint keeps one only for models with a "
        "Hugging Face config. Pass --config config.json (Python: config=...), the config of "
        "the trained model's architecture."
    )


def read_model_state(checkpoint: Path) -> dict[str, torch.Tensor]:
    """Every model tensor of the checkpoint, whole, on CPU, under the model's own names."""
    reader = dcp.FileSystemReader(str(checkpoint))
    metadata = reader.read_metadata()
    state = {
        key: torch.empty(item.size, dtype=item.properties.dtype)
        for key, item in metadata.state_dict_metadata.items()
        if key.startswith(MODEL_PREFIX) and isinstance(item, TensorStorageMetadata)
    }
    if not state:
        raise ConfigError(f"{checkpoint} holds no model tensors; was it written by "
                          "meshtrain_runtime.save_checkpoint?")
    with warnings.catch_warnings():  # one process without a process group is the point here
        warnings.filterwarnings("ignore", message="torch.distributed is disabled, unavailable",
                                category=UserWarning)
        dcp.load(state, storage_reader=reader, no_dist=True)
    return {key[len(MODEL_PREFIX):]: tensor for key, tensor in state.items()}


def export_to_hf(checkpoint: PathLike, out: PathLike, *, config: PathLike | None = None) -> Path:
    """Write `checkpoint`'s model as a Hugging Face folder `out` (config.json +
    model.safetensors) and return `out`. One process, CPU only; see the module doc."""
    source = resolve_checkpoint(checkpoint)
    config_file = resolve_config(source, config)
    if not has_safetensors():
        raise ConfigError("meshtrain export writes safetensors, which is not installed: "
                          "pip install safetensors (transformers installs it).")
    from safetensors.torch import save_file

    target = Path(out)
    if target.exists() and not target.is_dir():
        raise ConfigError(f"--hf {str(target)!r} is a file; pass a folder (it is created).")
    state = read_model_state(source)
    target.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(config_file, target / HF_CONFIG)
    save_file(unshared_tensors(state), str(target / "model.safetensors"), metadata={"format": "pt"})
    return target


def main(argv: list[str] | None = None) -> int:
    """The command ``meshtrain export`` runs; exit 2 with one line on a ConfigError."""
    parser = argparse.ArgumentParser(prog="python -m meshtrain_runtime.checkpoint.export")
    parser.add_argument("checkpoint")
    parser.add_argument("--hf", required=True, dest="out")
    parser.add_argument("--config")
    args = parser.parse_args(argv)
    try:
        written = export_to_hf(args.checkpoint, args.out, config=args.config)
    except ConfigError as error:
        print(f"meshtrain: {error}", file=sys.stderr)
        return 2
    names = json.loads((written / HF_CONFIG).read_text()).get("architectures") or ["a model"]
    print(f"exported {resolve_checkpoint(args.checkpoint)} to {written} ({names[0]}: "
          f"{HF_CONFIG}, model.safetensors)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
