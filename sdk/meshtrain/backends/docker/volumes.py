"""The Docker backend's options, checked when the Estimator is made (ConfigError, nothing run)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

from meshtrain.backends.docker.containers import CONTAINER_OPT_ML, Mount
from meshtrain.contract.errors import ConfigError

SIZE = re.compile(r"^(\d+)([bkmg]?)$", re.IGNORECASE)
UNITS = {"": 1, "b": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30}
MIN_SHM = 64 << 20


def parse_volumes(volumes: Any) -> list[Mount]:
    """``{host: container}`` (read-only) or ``[(host, container, "ro"|"rw"), ...]``."""
    if volumes is None:
        return []
    if isinstance(volumes, dict):
        volumes = [(h, c, "ro") for h, c in volumes.items()]
    if not isinstance(volumes, list | tuple):
        raise ConfigError(f"volumes must be a dict {{host_path: container_path}} or a list of "
                          f"(host_path, container_path, 'ro'|'rw'), got "
                          f"{type(volumes).__name__}.")
    return [_mount(entry) for entry in volumes]


def _mount(entry: Any) -> Mount:
    if not isinstance(entry, list | tuple) or len(entry) != 3 or entry[2] not in ("ro", "rw"):
        raise ConfigError(f"volumes entry {entry!r} must be (host_path, container_path, "
                          "'ro' or 'rw').")
    host, container = str(entry[0]), str(entry[1])
    if not Path(host).is_absolute() or not Path(host).exists():
        raise ConfigError(f"volumes: {host!r} must be an absolute path that exists on this "
                          "machine.")
    if not container.startswith("/") or container.rstrip("/") in ("", CONTAINER_OPT_ML):
        raise ConfigError(f"volumes: container path {container!r} must be absolute and not "
                          f"/ or {CONTAINER_OPT_ML} (each host's own tree is mounted there).")
    return Mount(host, container, read_only=entry[2] == "ro")


def parse_shm_size(value: Any) -> int | None:
    """Bytes (int) or a docker size string ("512m", "2g"); at least 64 MiB."""
    if value is None:
        return None
    match = SIZE.match(str(value).strip())
    if isinstance(value, bool) or match is None:
        raise ConfigError(f"shm_size={value!r} is not a size: give bytes (an int) or a string "
                          "such as '512m' or '2g'.")
    size = int(match.group(1)) * UNITS[match.group(2).lower()]
    if size < MIN_SHM:
        raise ConfigError(f"shm_size={value!r} is {size} bytes, below docker's 64 MiB "
                          f"({MIN_SHM} bytes); data loaders need more. Use e.g. '1g'.")
    return size


OPTIONS = frozenset({"jobs_dir", "volumes", "shm_size"})
"""The backend options Docker jobs take, declared once (meshtrain.targets reads them)."""


def check_options(jobs_dir: Any = None, volumes: Any = None, shm_size: Any = None) -> None:
    """The Docker options' values, checked when the Estimator is made (ConfigError)."""
    parse_volumes(volumes)
    parse_shm_size(shm_size)
