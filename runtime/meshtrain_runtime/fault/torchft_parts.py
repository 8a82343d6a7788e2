"""torchft's Manager and cross-group process group for one replica group (imported on use).

The Manager runs one quorum per step through the lighthouse, reconfigures the process group that
spans the live groups (gloo on CPU, NCCL on CUDA), and sends or receives the state a healing group
needs. ``use_async_quorum=False``: with FSDP2 the asynchronous quorum's state_dict() raced the
forward and backward passes (test-infrastructure.md).
"""

from __future__ import annotations

import os
import platform
import socket
from datetime import timedelta
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import TORCHFT_REQUIREMENT, ReplicaGroupEnv
from meshtrain_runtime.fault.binding import (
    bound_http_transport,
    job_service_address,
    made_bound,
)

REPLICA_ID_PREFIX = "meshtrain_ft_"
"""torchft reads a replica's group index from the trailing digits of its id."""


def import_torchft() -> Any:
    """The torchft module, or a RuntimeError that says why it is missing and how to install."""
    try:
        import torchft
        import torchft.process_group  # the submodule the Manager needs
    except ImportError as error:
        raise RuntimeError(
            "torch_distributed.fault_tolerance needs torchft, which this environment cannot "
            f"import ({error}). Install it with pip install 'meshtrain[ft]' ({TORCHFT_REQUIREMENT}"
            f"; Linux x86_64 only, this host is {platform.system()} {platform.machine()}), or "
            "remove fault_tolerance from the distribution.") from error
    return torchft


def recording_process_group(device_type: str, timeout: timedelta) -> Any:
    """torchft's reconfigurable process group for `device_type` that also remembers which
    replica groups each configuration spans (its ``participants``)."""
    from torchft.process_group import ProcessGroupGloo, ProcessGroupNCCL

    base = ProcessGroupNCCL if device_type == "cuda" else ProcessGroupGloo

    class Recording(base):  # type: ignore[misc, valid-type]
        participants: list[int] = []

        def configure(self, store_addr: str, replica_id: str, rank: int, world_size: int,
                      quorum_id: int | None = None, group_rank: int | None = None,
                      group_world_size: int | None = None,
                      global_ranks: list[int] | None = None) -> None:
            # global rank = replica group x ranks per group + group rank (torchft's numbering)
            per_group = group_world_size or 1
            self.participants = sorted({r // per_group for r in global_ranks or []})
            super().configure(store_addr, replica_id, rank, world_size, quorum_id, group_rank,
                              group_world_size, global_ranks)

    return Recording(timeout=timeout)


def check_group_world() -> None:
    """ConfigError unless this rank runs in a torchrun world (its group's own)."""
    for key in ("MASTER_ADDR", "MASTER_PORT"):
        if not os.environ.get(key):
            raise ConfigError(
                f"fault tolerance: {key} is not set. Each replica group runs as its own torchrun "
                "world (the backend starts it); a plain `python train.py` cannot join one.")


def build_manager(settings: ReplicaGroupEnv, *, group_rank: int, group_world_size: int,
                  device_type: str) -> tuple[Any, Any]:
    """(Manager, its process group) for this rank of replica group ``settings.replica_group``.

    The Manager's TCPStore is the group's own rendezvous store (torchrun's MASTER_ADDR/PORT).
    """
    import_torchft()
    from torchft.manager import Manager

    check_group_world()
    timeout = timedelta(seconds=settings.quorum_timeout_seconds)
    _forget_earlier_manager(group_rank, timeout)
    pg = recording_process_group(device_type, timeout)
    address = job_service_address()  # its servers listen on the job's interface (binding.py)
    manager = made_bound(Manager, address, group_rank)(
        pg=pg, load_state_dict=None, state_dict=None,
        min_replica_size=settings.min_replica_groups, use_async_quorum=False,
        timeout=timeout, quorum_timeout=timeout, connect_timeout=timeout,
        rank=group_rank, world_size=group_world_size,
        store_addr=os.environ["MASTER_ADDR"], store_port=int(os.environ["MASTER_PORT"]),
        lighthouse_addr=settings.lighthouse,
        replica_id=f"{REPLICA_ID_PREFIX}{settings.replica_group}",
        hostname=address or socket.gethostname(),
        checkpoint_transport=bound_http_transport(address, timeout),
    )
    return manager, pg


def _forget_earlier_manager(group_rank: int, timeout: timedelta) -> None:
    """Drop the Manager address an earlier incarnation of this group left in the store.

    torchrun restarting the group's workers in place keeps its TCPStore; the new ranks other than
    0 would read the dead Manager's address before rank 0 publishes its own. Rank 0 deletes it,
    and no rank goes on before that (a barrier of the group).
    """
    import torch.distributed as dist
    from torchft.manager import MANAGER_ADDR_KEY, REPLICA_ID_KEY

    if group_rank == 0:
        store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]),
                              is_master=False, wait_for_workers=False, timeout=timeout)
        for key in (MANAGER_ADDR_KEY, REPLICA_ID_KEY):
            store.delete_key(key)
    dist.barrier()


__all__ = ["build_manager", "check_group_world", "import_torchft", "recording_process_group"]
