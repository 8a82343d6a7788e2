"""SMP v2 (``torch.sagemaker``) compatibility: scripts written for SMP run on meshtrain's runtime.

``meshtrain_runtime.compat.smp`` is the SMP v2 surface (``tsm.init``, ``tsm.state``,
``tsm.transform``, ``tsm.delayed_param``, ``tsm.distributed.checkpoint`` ...) built on
meshtrain's runtime and torch. `install_torch_sagemaker()` makes ``import torch.sagemaker``
(and every ``torch.sagemaker.<sub>`` module) resolve to it; nothing is installed on import.

Inside ranks started by meshtrain the rank wrapper calls `install_for_rank()`, which installs the
alias only when the job's distribution enables ``smdistributed.modelparallel`` (the host exports
its parameters as ``SM_HP_MP_PARAMETERS``) and its parameters do not set
``torch_sagemaker_alias: false``. See docs/smp-compat.md.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys
from types import ModuleType

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import decode_mp_parameters

ALIAS = "torch.sagemaker"
TARGET = "meshtrain_runtime.compat.smp"
ALIAS_PARAMETER = "torch_sagemaker_alias"


class _AliasLoader(importlib.abc.Loader):
    """Loads ``torch.sagemaker.X`` as the already imported ``meshtrain_runtime.compat.smp.X``."""

    def __init__(self, target: str) -> None:
        self.target = target

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType:
        return importlib.import_module(self.target)

    def exec_module(self, module: ModuleType) -> None:
        """The target module ran when it was imported; nothing more to execute."""


class _AliasFinder(importlib.abc.MetaPathFinder):
    """Maps every name under ``torch.sagemaker`` to the same name under the compat package."""

    def find_spec(self, fullname: str, path: object = None, target: object = None):
        if fullname != ALIAS and not fullname.startswith(ALIAS + "."):
            return None
        real = TARGET + fullname[len(ALIAS):]
        real_spec = importlib.util.find_spec(real)
        if real_spec is None:
            return None
        spec = importlib.machinery.ModuleSpec(
            fullname,
            _AliasLoader(real),
            is_package=real_spec.submodule_search_locations is not None,
        )
        return spec


_FINDER = _AliasFinder()


def install_torch_sagemaker() -> ModuleType:
    """Make ``import torch.sagemaker`` (and its submodules) load meshtrain's SMP v2 surface.

    Like SMP's images (which ship a patched torch), it also gives torch's distributed-checkpoint
    functions SMP's conventions (global coordinator ranks, one checkpoint per tp rank, the
    optimizer loader's ``process_group``): see ``compat.smp._torch_dcp``. Call it once before
    the script's ``import torch.sagemaker``; idempotent. Returns the module.
    """
    if _FINDER not in sys.meta_path:
        sys.meta_path.insert(0, _FINDER)
    module = importlib.import_module(ALIAS)
    import torch

    from meshtrain_runtime.compat.smp import _torch_dcp

    _torch_dcp.install()

    torch.sagemaker = module  # `import torch.sagemaker as tsm` reads the attribute
    return module


def uninstall_torch_sagemaker() -> None:
    """Remove the alias and give torch its own checkpoint functions back (the compat modules
    stay imported under their own names)."""
    if "meshtrain_runtime.compat.smp._torch_dcp" in sys.modules:
        sys.modules["meshtrain_runtime.compat.smp._torch_dcp"].remove()
    if _FINDER in sys.meta_path:
        sys.meta_path.remove(_FINDER)
    for name in [n for n in sys.modules if n == ALIAS or n.startswith(ALIAS + ".")]:
        del sys.modules[name]
    torch = sys.modules.get("torch")
    if torch is not None and hasattr(torch, "sagemaker"):
        del torch.sagemaker


def is_installed() -> bool:
    """True while the ``torch.sagemaker`` alias is installed in this process."""
    return _FINDER in sys.meta_path


def alias_wanted(environ: dict[str, str] | os._Environ | None = None) -> bool:
    """True when this rank's job enables SMP and did not turn the alias off.

    SMP is enabled when ``SM_HP_MP_PARAMETERS`` holds a non-empty JSON object (the training
    toolkit's rule); the meshtrain parameter ``torch_sagemaker_alias: false`` turns it off.
    """
    try:
        value = decode_mp_parameters(os.environ if environ is None else environ)
    except ConfigError:
        return False  # tsm.init / meshtrain_runtime.init report the bad value with its fix
    return bool(value) and value.get(ALIAS_PARAMETER, True) is not False


def install_for_rank() -> None:
    """Called by the rank wrapper before the user's script: the alias, if the job wants it."""
    if alias_wanted():
        install_torch_sagemaker()


__all__ = [
    "ALIAS",
    "alias_wanted",
    "install_for_rank",
    "install_torch_sagemaker",
    "is_installed",
    "uninstall_torch_sagemaker",
]
