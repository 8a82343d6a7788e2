"""meshtrain's runtime, shipped inside sourcedir.tar.gz for images that do not contain it.

AWS's PyTorch training images (``pytorch-training``, ``smdistributed-modelparallel``) run the
SageMaker training toolkit, which unpacks the code into ``/opt/ml/code``, puts that directory
first on ``sys.path`` and exports it in ``PYTHONPATH`` to every process it starts (torchrun's
ranks included). So ``meshtrain_runtime/`` and ``meshtrain/contract/`` (with
``meshtrain/__init__.py`` and ``version.py``) are packed at the top of the archive, next to the
user's code: ``import meshtrain_runtime`` then works in the entry point wherever it sits, and the
request stays the one the SageMaker SDK sends. The runtime's one requirement beyond torch,
pydantic, is added to the archive's ``requirements.txt`` (a copy: the user's file is not
changed), which the toolkit installs before it starts the script.
"""

from __future__ import annotations

import importlib.util
import shutil
from pathlib import Path

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.version import CLIENT_PACKAGE

AWS_REPOSITORIES = ("/pytorch-training:", "/smdistributed-modelparallel:")
RUNTIME_REQUIREMENTS = ("pydantic>=2.6",)
SHIPPED_PACKAGES = ("meshtrain", "meshtrain_runtime")


def ships_runtime(spec: JobSpec, image_uri: str) -> bool:
    """Ship for AWS's PyTorch images, from a local source that has no copy of its own."""
    if spec.source_dir.startswith("s3://") or not any(r in image_uri for r in AWS_REPOSITORIES):
        return False
    source = Path(spec.source_dir)
    return not (source.is_dir() and any((source / name).exists() for name in SHIPPED_PACKAGES))


def stage_runtime(scratch: Path) -> list[Path]:
    """Copies of `meshtrain/{__init__.py,version.py,contract}` and `meshtrain_runtime` under
    `scratch`, as dependency directories for write_sourcedir_tarball (each under its name)."""
    runtime = importlib.util.find_spec("meshtrain_runtime")  # located, not imported (torch)
    if runtime is None or runtime.origin is None:
        raise ConfigError("meshtrain_runtime is not installed next to meshtrain, so it cannot be "
                          "shipped to the AWS image: reinstall meshtrain, or pass image_uri.")
    client = CLIENT_PACKAGE
    shipped = scratch / "meshtrain"
    shipped.mkdir(parents=True)
    for name in ("__init__.py", "version.py"):  # the package's __init__ imports its version
        shutil.copy2(client / name, shipped / name)
    shutil.copytree(client / "contract", shipped / "contract",
                    ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
    return [shipped, Path(runtime.origin).parent]


def requirements_with_runtime(spec: JobSpec) -> dict[str, bytes]:
    """``requirements.txt`` for the archive: the user's lines, then the runtime's needs."""
    source = Path(spec.source_dir)
    existing = source / "requirements.txt" if source.is_dir() else None
    text = existing.read_text() if existing is not None and existing.is_file() else ""
    missing = [r for r in RUNTIME_REQUIREMENTS if r.split(">")[0] not in text]
    if not missing:
        return {}
    lines = text if not text or text.endswith("\n") else text + "\n"
    return {"requirements.txt": (lines + "# meshtrain runtime\n" + "\n".join(missing)
                                 + "\n").encode()}
