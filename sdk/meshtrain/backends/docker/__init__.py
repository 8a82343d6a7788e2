"""Local Docker backend: one container per host (instance_type "local_docker", "local_gpu").

Imported lazily (``meshtrain.backends.docker:DockerBackend``): the supervisor module runs as
``python -m meshtrain.backends.docker.supervisor`` and must not be imported by this package.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DockerBackend", "DockerTrainingJob"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from meshtrain.backends.docker import backend

        return getattr(backend, name)
    raise AttributeError(f"module 'meshtrain.backends.docker' has no attribute {name!r}")
