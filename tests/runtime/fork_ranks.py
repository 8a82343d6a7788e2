"""Start a world of local ranks the way torchrun does, from one process that has imported torch
(and transformers, when installed) once: each rank is a fork of it.

    python tests/runtime/fork_ranks.py NPROC WORKER [ARGS...]

Why: a rank of the runtime tests spends most of its CPU importing torch.distributed, DTensor and
transformers (about 2-4 CPU-seconds each, 9 for four ranks of a 2-core box), more than many of
the tests' own work. Forked after those imports, a rank starts with them done.

What a rank sees is what torchrun's ranks see: the environment torchrun sets for a standalone
single-node run (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR/PORT, GROUP_RANK, ROLE_*,
TORCHELASTIC_*; rank 0 serves the store, as env:// does without torchrun's agent store; no
TORCHELASTIC_ERROR_FILE: rank_entry records a failing rank's error itself),
fresh Python and numpy random states, and ``meshtrain_runtime.host.rank_entry``'s run and clean end
of the worker. As torchrun does, the first rank to fail ends the others, and this process
exits with that rank's code. tests/runtime/test_fork_ranks.py runs a worker under this and
under torchrun and compares what the ranks saw.
"""

from __future__ import annotations

import contextlib
import importlib
import os
import random
import signal
import socket
import sys
import uuid

PRELOAD = (
    "torch", "torch.distributed", "torch.distributed.tensor", "torch.distributed.fsdp",
    "torch.distributed.checkpoint", "torch.distributed.pipelining", "meshtrain_runtime",
    "meshtrain_runtime.parallelize", "meshtrain_runtime.compat",
)
PRELOAD_IF_INSTALLED = ("transformers.modeling_utils",
                        "transformers.models.llama.modeling_llama")


def preload() -> None:
    """Import what every rank would import itself."""
    from meshtrain_runtime.host.import_noise import quiet_torchao_import

    quiet_torchao_import()  # transformers imports torchao, as in a rank
    for name in PRELOAD:
        importlib.import_module(name)
    for name in PRELOAD_IF_INSTALLED:
        with contextlib.suppress(ImportError):  # an extra: its tests skip without it
            importlib.import_module(name)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def world_env(nproc: int, port: int) -> dict[str, str]:
    """The variables torchrun --standalone sets on every rank of one node (RANK, LOCAL_RANK and
    ROLE_RANK are each rank's)."""
    return {
        "MASTER_ADDR": "localhost", "MASTER_PORT": str(port), "WORLD_SIZE": str(nproc),
        "LOCAL_WORLD_SIZE": str(nproc), "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1",
        "ROLE_NAME": "default", "ROLE_WORLD_SIZE": str(nproc),
        "TORCHELASTIC_RUN_ID": str(uuid.uuid4()), "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_MAX_RESTARTS": "0", "TORCHELASTIC_USE_AGENT_STORE": "False",
        "TORCHELASTIC_SIGNALS_TO_HANDLE": "SIGTERM,SIGINT,SIGHUP,SIGQUIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "1",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }


def run_rank(rank: int, env: dict[str, str], worker: str, args: list[str]) -> None:
    """In the forked child: become rank `rank` and run the worker as rank_entry does."""
    from meshtrain_runtime.host.rank_entry import end_process, run_entry_point

    code = 1
    try:
        os.environ.update(env, RANK=str(rank), LOCAL_RANK=str(rank), ROLE_RANK=str(rank))
        random.seed()  # a process of its own would not share the parent's random states
        numpy = sys.modules.get("numpy")  # torch imports it
        if numpy is not None:
            numpy.random.seed()
        code = run_entry_point(worker, args)
    finally:
        end_process(code)


def wait_for(children: dict[int, int]) -> int:
    """Wait for every rank; the first that fails ends the others. Returns the exit code."""
    code = 0
    while children:
        pid, status = os.wait()
        rank = children.pop(pid)
        exit_code = os.waitstatus_to_exitcode(status)
        if exit_code != 0 and code == 0:
            code = exit_code if exit_code > 0 else 128 - exit_code
            print(f"fork_ranks: rank {rank} exited {exit_code}; ending the others",
                  file=sys.stderr, flush=True)
            for other in children:
                os.kill(other, signal.SIGKILL)
    return code


def main(argv: list[str]) -> int:
    nproc, worker, args = int(argv[0]), argv[1], argv[2:]
    before = dict(os.environ)
    preload()
    for name in set(os.environ) - set(before):  # set by an import (the inductor's cache dir)
        del os.environ[name]
    env = world_env(nproc, free_port())
    children: dict[int, int] = {}
    for rank in range(nproc):
        sys.stdout.flush()
        sys.stderr.flush()
        pid = os.fork()
        if pid == 0:
            run_rank(rank, env, worker, args)  # never returns: end_process exits
        children[pid] = rank
    return wait_for(children)


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
