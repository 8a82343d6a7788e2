"""`meshtrain export CHECKPOINT --hf OUT [--config config.json]`: a sharded checkpoint to a
Hugging Face folder, without GPUs or a job.

The client never imports torch, so the export itself runs in the runtime, as a process of this
Python (``python -m meshtrain_runtime.checkpoint.export``). What can be checked without torch is
checked here first, so a mistake is a ConfigError before any process starts.
"""

from __future__ import annotations

import argparse
import importlib.util
import re
import subprocess
import sys
from pathlib import Path

from meshtrain.contract.errors import ConfigError

MARKER_NAME = "meshtrain-checkpoint.json"  # meshtrain_runtime.checkpoint.MARKER_NAME (tested)
_STEP_DIR = re.compile(r"^step_(\d+)$")


def register_export(sub: argparse._SubParsersAction) -> None:
    """Add the export subcommand."""
    export = sub.add_parser(
        "export", help="write a checkpoint as a Hugging Face folder (config.json + safetensors)")
    export.add_argument("checkpoint", help="a folder save_checkpoint wrote, or the root of its "
                                           "step_<n> folders (the newest completed one is used)")
    export.add_argument("--hf", required=True, metavar="OUT",
                        help="the folder to write (from_pretrained(OUT) loads it)")
    export.add_argument("--config", help="the model's config.json; needed when the checkpoint "
                                         "has none beside it (models without an HF config)")
    export.set_defaults(handler=run_export)


def completed_checkpoint(path: Path) -> Path:
    """`path` if it holds a completed save, else its newest completed step_<n> folder."""
    if (path / MARKER_NAME).is_file():
        return path
    steps = [(int(match.group(1)), child) for child in (path.iterdir() if path.is_dir() else [])
             if (match := _STEP_DIR.match(child.name)) and (child / MARKER_NAME).is_file()]
    if not steps:
        raise ConfigError(
            f"{str(path)!r} holds no completed meshtrain checkpoint (no {MARKER_NAME} in it or in "
            "a step_<n> folder under it). Pass the folder save_checkpoint wrote.")
    return max(steps)[1]


def check_export(args: argparse.Namespace) -> Path:
    """The checkpoint folder to export; ConfigError for what is wrong, before any process."""
    checkpoint = completed_checkpoint(Path(args.checkpoint))
    if args.config is not None and not Path(args.config).is_file():
        raise ConfigError(f"--config {args.config!r} is not a file. Pass the model's "
                          "config.json (config.save_pretrained(folder) writes one).")
    if args.config is None and not (checkpoint / "config.json").is_file():
        raise ConfigError(
            f"{checkpoint} has no config.json: save_checkpoint keeps one only for models with "
            "a Hugging Face config. Pass --config config.json, the config of the trained "
            "model's architecture.")
    if Path(args.hf).exists() and not Path(args.hf).is_dir():
        raise ConfigError(f"--hf {args.hf!r} is a file; pass a folder (it is created).")
    missing = [name for name in ("torch", "safetensors", "meshtrain_runtime")
               if importlib.util.find_spec(name) is None]
    if missing:
        raise ConfigError(f"meshtrain export runs the runtime, but {', '.join(missing)} is not "
                          "installed here: pip install 'meshtrain[runtime,hf]'.")
    return checkpoint


def run_export(args: argparse.Namespace) -> int:
    """Check, then run the runtime's exporter in a process of this Python."""
    checkpoint = check_export(args)
    command = [sys.executable, "-m", "meshtrain_runtime.checkpoint.export", str(checkpoint),
               "--hf", args.hf, *(["--config", args.config] if args.config else [])]
    return subprocess.run(command, check=False).returncode
