"""The SMP v2 ``torch.sagemaker`` surface on meshtrain's runtime (imported as ``tsm``).

SMP's flow is kept: ``tsm.init()`` resolves the layout (the estimator's parameters win over the
dict given here) and patches torch's FSDP entry points so that the script's own
``FullyShardedDataParallel(...)`` (FSDP1) or ``fully_shard(...)`` (FSDP2) call without a process
group or mesh shards over SMP's hybrid-shard group with the strategy rules H0-H2;
``tsm.transform`` does only the model conversion (tensor / expert parallelism, dtype; meta
models stay on meta for FSDP's ``param_init_fn``). Submodules (``tsm.delayed_param``,
``tsm.distributed.checkpoint`` ...) load on first import. See docs/smp-compat.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from meshtrain_runtime.compat.smp._state import state
from meshtrain_runtime.compat.smp._transform import transform

if TYPE_CHECKING:
    import os


def init(config: dict[str, Any] | str | os.PathLike | None = None) -> None:
    """Initialise SMP: parameters (estimator's win over `config`), mesh, FSDP defaults.

    `config` is a dict of SMP parameters or the path to a JSON file of them (HyperPod's
    ``smp_config.json``). Call it after ``dist.init_process_group`` (or let it start one) and
    before the model is wrapped by FSDP.
    """
    from meshtrain_runtime.compat.smp import _fsdp

    state._initialise(config)
    _fsdp.install_fsdp_defaults()


def is_initialized() -> bool:
    """True after `init()` and before ``state.reset()``."""
    return state._is_initialised()


def reset() -> None:
    """Forget SMP's state and remove the FSDP defaults (``tsm.state.reset()`` does the same)."""
    state.reset()


__all__ = ["init", "is_initialized", "reset", "state", "transform"]
