"""Shared helpers for runtime tests: launch a torchrun worker and collect its JSON results.

Also `single_process_runtime`: a world of one process in the pytest process itself (no torchrun),
for unit tests of init()/state/transform; it clears the launcher's environment variables and
resets the runtime (destroying the process group it created) afterwards.

Usage (a test):

    def test_something(torchrun):
        records = torchrun(WORKERS / "hsdp_layouts.py", 4, "--flag", timeout=300)

The worker runs on every rank under ``meshtrain_runtime.host.rank_entry`` (clean rank exit) with
OMP_NUM_THREADS=1 and calls ``report({...})`` from tests/runtime/workers/report.py. The helper
returns every record of every rank, ordered by rank then by call order; each has a "rank" key.

The ranks are forked, with torchrun's environment, from one process that imported torch and
transformers once (fork_ranks.py: a rank's imports cost more CPU than many tests' work);
MESHTRAIN_TEST_LAUNCHER=torchrun starts them with torchrun itself.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import tempfile
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

WORKERS = Path(__file__).parent / "workers"
RESULTS_ENV = "MESHTRAIN_TEST_RESULTS"
LAUNCHER_ENV = "MESHTRAIN_TEST_LAUNCHER"
FORK_RANKS = Path(__file__).parent / "fork_ranks.py"


def run_torchrun(
    worker: str | os.PathLike,
    nproc: int,
    *args: str,
    timeout: float = 300,
    env: dict[str, str] | None = None,
) -> list[dict[str, Any]]:
    """Run `worker` on `nproc` local ranks (gloo, one host); return the reported records.

    Fails the test with the output tail when the launch fails or exceeds `timeout` seconds
    (the whole process group is killed then).
    """
    with tempfile.TemporaryDirectory(prefix="meshtrain-torchrun-") as results:
        command = launch_command(nproc, worker, *args)
        child_env = {**os.environ, "OMP_NUM_THREADS": "1", RESULTS_ENV: results, **(env or {})}
        child_env.pop("SM_HP_MP_PARAMETERS", None)
        output, code = _run(command, child_env, timeout)
        if code != 0:
            pytest.fail(f"{Path(worker).name} on {nproc} ranks exited {code}:\n{output[-6000:]}")
        return _read_records(Path(results), nproc)


def launch_command(nproc: int, worker: str | os.PathLike, *args: str,
                   launcher: str | None = None) -> list[str]:
    """The command line that runs `worker` on `nproc` ranks: fork_ranks.py, or torchrun when
    `launcher` (default: $MESHTRAIN_TEST_LAUNCHER) is "torchrun"."""
    if (launcher or os.environ.get(LAUNCHER_ENV)) == "torchrun":
        return [sys.executable, "-m", "torch.distributed.run", "--standalone",
                f"--nproc-per-node={nproc}", "-m", "meshtrain_runtime.host.rank_entry",
                str(worker), *args]
    return [sys.executable, str(FORK_RANKS), str(nproc), str(worker), *args]


def _run(command: list[str], env: dict[str, str], timeout: float) -> tuple[str, int]:
    process = subprocess.Popen(
        command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    try:
        output, _ = process.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        os.killpg(process.pid, signal.SIGKILL)  # torchrun and its ranks: our own session only
        output, _ = process.communicate()
        return f"{output}\n[timed out after {timeout} s]", -9
    return output, process.returncode


def _read_records(directory: Path, nproc: int) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    for rank in range(nproc):
        path = directory / f"rank-{rank}.jsonl"
        if path.exists():
            records.extend(json.loads(line) for line in path.read_text().splitlines() if line)
    return records


@pytest.fixture(scope="session")
def torchrun() -> Callable[..., list[dict[str, Any]]]:
    """The `run_torchrun` helper as a fixture (session scope, so module fixtures can use it)."""
    return run_torchrun


_LAUNCH_VARIABLES = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
    "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SM_HP_MP_PARAMETERS", "SM_HOST_COUNT",
)


@pytest.fixture
def single_process_runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """The `meshtrain_runtime.state` module, uninitialised, in a clean single-process env."""
    from meshtrain_runtime import state

    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    state.reset(destroy_process_group=True)
    yield state
    state.reset(destroy_process_group=True)
