"""fork_ranks.py, the runtime tests' launcher, against torchrun: the ranks it forks see the world
torchrun's ranks see, and a failing rank ends the launch as under torchrun."""

from __future__ import annotations

import os
import re
import subprocess
from typing import Any

import pytest
from conftest import LAUNCHER_ENV, RESULTS_ENV, WORKERS, launch_command

pytestmark = pytest.mark.multiprocess
WORKER = WORKERS / "launch_view.py"
# set by torchrun to values of its own run (a port, an id, its agent's store, its error files)
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_USE_AGENT_STORE",
           "TORCHELASTIC_ERROR_FILE"}


def _views(torchrun: Any, monkeypatch: pytest.MonkeyPatch, launcher: str) -> list[dict]:
    monkeypatch.setenv(LAUNCHER_ENV, launcher)
    return sorted(torchrun(WORKER, 3, timeout=120), key=lambda record: record["rank"])


@pytest.fixture(scope="module")
def views(torchrun: Any) -> dict[str, list[dict]]:
    with pytest.MonkeyPatch.context() as monkeypatch:
        return {launcher: _views(torchrun, monkeypatch, launcher)
                for launcher in ("torchrun", "fork")}


def test_every_rank_sees_the_world_torchrun_gives(views):
    under_torchrun, forked = views["torchrun"], views["fork"]
    assert [v["rank"] for v in forked] == [v["rank"] for v in under_torchrun] == [0, 1, 2]
    assert all(v["world_size"] == 3 and v["elastic"] for v in forked + under_torchrun)
    outside = set(os.environ) | {RESULTS_ENV, LAUNCHER_ENV, "OMP_NUM_THREADS"}
    for torchrun_view, fork_view in zip(under_torchrun, forked, strict=True):
        set_by_torchrun = {k: v for k, v in torchrun_view["env"].items() if k not in outside}
        assert {"RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR"} <= set(set_by_torchrun)
        set_by_fork = {k: v for k, v in fork_view["env"].items() if k not in outside}
        assert {k: v for k, v in set_by_fork.items() if k not in PER_RUN} == {
            k: v for k, v in set_by_torchrun.items() if k not in PER_RUN}
        assert set(set_by_fork) == set(set_by_torchrun) - {"TORCHELASTIC_ERROR_FILE"}


def test_forked_ranks_draw_their_own_random_numbers(views):
    assert len({v["random"][0] for v in views["fork"]}) == 3  # Python's
    assert len({v["random"][1] for v in views["fork"]}) == 3  # numpy's


def test_a_failing_rank_ends_the_others_and_the_launch(tmp_path):
    env = {**os.environ, RESULTS_ENV: str(tmp_path), "OMP_NUM_THREADS": "1"}
    run = subprocess.run(launch_command(3, WORKER, "--fail-rank", "1", launcher="fork"),
                         env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 1, run.stdout + run.stderr
    assert "RuntimeError: rank 1 fails on purpose" in run.stderr
    # its peers fail too once its process group is gone: whichever is reaped first is named
    assert re.search(r"fork_ranks: rank \d exited 1; ending the others", run.stderr), run.stderr
