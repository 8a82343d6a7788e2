"""A loader's source given by name: a SageMaker channel (``"train"`` -> its directory) or a path.

A name that is a channel of the job (``SM_CHANNEL_<NAME>``, ``inputdataconfig.json`` or a
directory ``/opt/ml/input/data/<name>``) is that channel; anything else is a local file or
directory. File and FastFile channels are directories of files, read like any directory. Pipe
mode is refused: a Pipe channel is a stream of FIFOs (``<name>_<epoch>``) that can only be read
from its start, so the loader could neither read a batch by its global position (the same
batches on any layout) nor resume without replaying every consumed batch.
"""

from __future__ import annotations

import json
import os
import re
import stat
from pathlib import Path
from typing import Any

from meshtrain.contract.env import SM_CHANNEL_PREFIX, SM_INPUT_DATA_CONFIG
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import env_name
from meshtrain.contract.paths import OptMLPaths

_CHANNEL_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def resolve_location(source: str | os.PathLike) -> Path:
    """The file or directory `source` names: a channel of this job, else a local path."""
    text = os.fspath(source)
    if "://" in text:
        raise ConfigError(
            f"loader({text!r}): the loader reads local files. Give the URI to the job as a "
            f"channel (fit(inputs={{'train': {text!r}}})) and pass the channel's name, "
            "loader('train', ...).")
    if _CHANNEL_NAME.match(text):
        channel = channel_directory(text)
        if channel is not None:
            return channel
    path = Path(text).expanduser()
    if path.exists():
        return path
    channels = sorted(input_data_config()) or ["none"]
    raise ConfigError(
        f"loader({text!r}): no such file or directory, and no channel of that name (this job's "
        f"channels: {', '.join(channels)}). Pass a channel name given to fit(inputs=...) or a "
        "path to a file or directory of data.")


def channel_directory(name: str) -> Path | None:
    """The directory of channel `name`, None when the job has no such channel."""
    paths = OptMLPaths.from_env()
    config = input_data_config()
    from_env = os.environ.get(env_name(SM_CHANNEL_PREFIX, name))
    directory = Path(from_env) if from_env else paths.input_data_dir / name
    mode = config.get(name, {}).get("TrainingInputMode")
    if mode == "Pipe" or (not directory.exists()
                          and _is_fifo(paths.input_data_dir / f"{name}_0")):
        raise ConfigError(
            f"channel {name!r} is in Pipe mode: its data is a stream that can only be read from "
            "the start, so the loader could not read a batch by its global position (the same "
            "batches on every layout) nor resume without replaying every batch read before. "
            f"Give the channel input_mode='File' or 'FastFile'.")
    if name in config or from_env or directory.is_dir():
        if not directory.exists():
            raise ConfigError(f"channel {name!r}: its directory {directory} does not exist on "
                              "this host. Check the channel's data source in fit(inputs=...).")
        return directory
    return None


def input_data_config() -> dict[str, Any]:
    """This host's channels as SageMaker describes them (empty outside a job)."""
    given = os.environ.get(SM_INPUT_DATA_CONFIG)
    if given:
        try:
            return dict(json.loads(given))
        except (ValueError, TypeError):
            pass  # fall back to the file the environment variable copies
    path = OptMLPaths.from_env().input_data_config_file
    try:
        return dict(json.loads(path.read_text()))
    except (OSError, ValueError, TypeError):
        return {}


def _is_fifo(path: Path) -> bool:
    try:
        return stat.S_ISFIFO(path.stat().st_mode)
    except OSError:
        return False


__all__ = ["channel_directory", "input_data_config", "resolve_location"]
