"""host.fork_server: on a host without GPUs the ranks are forks of a server the torchrun agent
forks after importing torch, which preloads what the ranks import. The ranks see what ranks of
their own see; a failing rank, a stop and a killed agent end as they do without it."""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import pytest

from meshtrain.backends.hosts.processes import pids_of_job, rank_number
from meshtrain_runtime.host import fork_server, rank_entry, rank_preload

pytestmark = pytest.mark.multiprocess
WORKER = Path(__file__).parents[1] / "workers" / "fork_view.py"
RESULTS_ENV = "MESHTRAIN_TEST_RESULTS"
# set by torchrun to values of its own run, or by this test for one launch only
PER_RUN = {"MASTER_PORT", "TORCHELASTIC_RUN_ID", "TORCHELASTIC_ERROR_FILE", RESULTS_ENV,
           "MESHTRAIN_RANK_PRELOAD", "MESHTRAIN_RANK_ERROR_DIR"}
# a parent that carries a job token, as a job's bootstrap does (the agent's lifeline holds),
# and outlives a SIGTERM to the process group without passing it on: each process of the
# group gets one (a second SIGTERM in the middle of torchrun's shutdown is torchrun's own
# matter, and made this test's output depend on timing)
TOKEN_PARENT = ("import signal, subprocess, sys; agent = subprocess.Popen(sys.argv[1:]); "
                "signal.signal(signal.SIGTERM, signal.SIG_IGN); sys.exit(agent.wait())")


def agent_command(log_dir: Path, forked: bool, *worker_args: str) -> list[str]:
    """The torchrun agent's command for one host of two ranks, as the bootstrap builds it."""
    command = [sys.executable, "-m", "meshtrain_runtime.host.agent_entry", "--nproc-per-node",
               "2", "--nnodes", "1"]
    if forked:
        command += ["--start-method", "forkserver", "--run-path"]
    ranks = [rank_entry.__file__] if forked else ["-m", "meshtrain_runtime.host.rank_entry"]
    return [*command, "--tee", "3", "--log-dir", str(log_dir), *ranks, str(WORKER),
            *worker_args]


def start(tmp_path: Path, forked: bool, *worker_args: str, token: str | None = None
          ) -> subprocess.Popen:
    results = tmp_path / "results"
    results.mkdir(parents=True, exist_ok=True)
    # a rank that does not leave when torchrun ends the ranks would be killed after this, long
    # after the launches' 180-s wait: such a hang fails the test instead
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1",
           RESULTS_ENV: str(results), "MESHTRAIN_RANK_ERROR_DIR": str(tmp_path / "errors"),
           "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": "600"}
    if forked:
        env["MESHTRAIN_RANK_PRELOAD"] = ",".join(rank_preload.preload_modules(WORKER))
    command = agent_command(tmp_path / "logs", forked, *worker_args)
    if token:
        env["MESHTRAIN_JOB_TOKEN"] = token
        command = [sys.executable, "-c", TOKEN_PARENT, *command]
    return subprocess.Popen(command, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, start_new_session=True)


def records(tmp_path: Path) -> list[dict[str, Any]]:
    found = []
    for path in sorted((tmp_path / "results").glob("rank-*.jsonl")):
        found += [json.loads(line) for line in path.read_text().splitlines() if line]
    return sorted(found, key=lambda record: record["rank"])


def children_of(pid: int) -> list[int]:
    found = []
    for entry in Path("/proc").glob("[0-9]*"):
        try:
            stat = (entry / "stat").read_text()
        except OSError:
            continue
        if int(stat[stat.rindex(")") + 2:].split()[1]) == pid:
            found.append(int(entry.name))
    return found


def wait_running(agent: subprocess.Popen, ranks: int = 2) -> list[str]:
    seen = []
    for line in agent.stdout:
        seen.append(line)
        if sum("running rank" in s for s in seen) == ranks:
            return seen
    raise AssertionError("".join(seen))


def gone(pids: list[int], timeout: float = 30.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{pid}").exists() and Path(f"/proc/{pid}/stat").read_text()
                   .split(") ")[1][0] != "Z" for pid in pids):
            return True
        time.sleep(0.1)
    return False


@pytest.fixture(scope="module")
def launches(tmp_path_factory) -> dict[str, Any]:
    """One launch of each kind: the ranks' views (exec'd and forked; the forked launch is then
    stopped with SIGTERM, as a job's stop does)."""
    exec_dir, fork_dir = (tmp_path_factory.mktemp(kind) for kind in ("exec", "fork"))
    plain = start(exec_dir, False)
    plain_output, _ = plain.communicate(timeout=180)
    assert plain.returncode == 0, plain_output
    agent = start(fork_dir, True, "--sleep", token=f"fork-server-test-{os.getpid()}")
    wait_running(agent)
    views = records(fork_dir)
    os.killpg(agent.pid, signal.SIGTERM)  # a job's stop: every process of the host
    stop_output, _ = agent.communicate(timeout=180)
    stopped = [r for r in records(fork_dir) if r.get("stopped")]
    return {"exec": records(exec_dir), "fork": views, "stopped": stopped,
            "stop_output": stop_output, "stop_code": agent.returncode}


def test_forked_ranks_see_the_environment_of_ranks_of_their_own(launches):
    plain, forked = launches["exec"], launches["fork"]
    assert [v["rank"] for v in plain] == [v["rank"] for v in forked] == [0, 1]
    for exec_view, fork_view in zip(plain, forked, strict=True):
        exec_env = {k: v for k, v in exec_view["env"].items() if k not in PER_RUN}
        fork_env = {k: v for k, v in fork_view["env"].items() if k not in PER_RUN}
        fork_env.pop("MESHTRAIN_JOB_TOKEN")  # the stopped launch ran under a token parent
        assert fork_env == exec_env
        assert fork_view["name"] == exec_view["name"] == f"mt-rank-{fork_view['rank']}"
        assert fork_view["process"] == exec_view["process"] == "MainProcess"
        assert not fork_view["sigterm_blocked"] and not exec_view["sigterm_blocked"]


def test_forked_ranks_start_with_the_imports_done_and_draw_their_own_numbers(launches):
    forked = launches["fork"]
    assert all(v["preloaded"] for v in forked)
    assert len({v["random"][0] for v in forked}) == 2  # Python's
    assert len({v["random"][1] for v in forked}) == 2  # numpy's


def test_the_ranks_are_forks_of_one_server_the_agent_forked(launches):
    """A fork (its parent is the agent, not a fresh interpreter): the standard library still
    starts its fork server through the call fork_server.start replaces."""
    parents = {v["parent"]["pid"]: v["parent"] for v in launches["fork"]}
    (server,) = parents.values()
    assert server["name"] == fork_server.SERVER_PROCESS_NAME
    agent_of_rank = {v["parent"]["ppid"] for v in launches["fork"]}
    assert len(agent_of_rank) == 1 and agent_of_rank != {server["pid"]}


def test_a_stop_gives_forked_ranks_their_grace_and_ends_in_one_line(launches):
    """The fork server, also sent SIGTERM, outlives it: its ranks (which die with it) finish
    the second of work they take after the stop, and then leave (torchrun, ending them, no
    longer reads the result it would otherwise wait to hand over)."""
    assert [r["rank"] for r in launches["stopped"]] == [0, 1]
    assert "forcefully exiting" not in launches["stop_output"]
    assert launches["stop_code"] == 128 + signal.SIGTERM, launches["stop_output"]
    assert "Traceback" not in launches["stop_output"]
    assert launches["stop_output"].strip().splitlines()[-1] == (
        "meshtrain: torchrun stopped by SIGTERM; its workers were ended (a stop, not an error)")


def test_a_failing_forked_rank_is_recorded_and_fails_the_launch(tmp_path):
    agent = start(tmp_path, True, "--fail-rank", "1")
    output, _ = agent.communicate(timeout=180)
    assert agent.returncode == 1, output
    assert "RuntimeError: rank 1 fails on purpose" in output
    assert re.search(r"meshtrain: torchrun: rank \d \(exit code 1\)", output), output
    failures = json.loads((tmp_path / "errors" / "agent-failures.json").read_text())
    assert {f["exitcode"] for f in failures} == {1}, failures
    record = json.loads((tmp_path / "errors" / "rank-1.json").read_text())
    assert "rank 1 fails on purpose" in record["traceback"]  # the root cause, by its time


def _die(rank: int) -> None:
    """Rank 1 is SIGKILLed; rank 0, its peer, fails a moment later."""
    if rank == 1:
        os.kill(os.getpid(), signal.SIGKILL)
    time.sleep(0.3)
    os._exit(1)


def test_torchrun_names_every_forked_rank_that_failed_not_only_the_first(tmp_path):
    """Both ranks are dead when torchrun first looks: torch's context for function ranks names
    rank 0 only (the first in rank order); with report_every_failed_rank, rank 1's SIGKILL too."""
    from torch.distributed.elastic.multiprocessing import DefaultLogsSpecs, start_processes

    assert fork_server.report_every_failed_rank()  # the installed torch has the shape it needs
    context = start_processes("die", _die, args={0: (0,), 1: (1,)}, envs={0: {}, 1: {}},
                              logs_specs=DefaultLogsSpecs(log_dir=str(tmp_path)),
                              start_method="fork")
    for process in context._pc.processes:
        process.join(timeout=60)
    result = context.wait(timeout=60)
    assert {rank: f.exitcode for rank, f in result.failures.items()} == {
        0: 1, 1: -signal.SIGKILL}


def test_a_killed_rank_is_named_by_the_agent(tmp_path):
    agent = start(tmp_path, True, "--sleep")
    wait_running(agent)
    (rank_1,) = [record["pid"] for record in records(tmp_path) if record["rank"] == 1]
    os.kill(rank_1, signal.SIGKILL)
    output, _ = agent.communicate(timeout=180)
    assert agent.returncode == 1, output
    failures = json.loads((tmp_path / "errors" / "agent-failures.json").read_text())
    assert {(f["rank"], f["exitcode"]) for f in failures} >= {(1, -signal.SIGKILL)}, failures


def test_a_killed_agent_takes_its_server_and_ranks_with_it(tmp_path):
    token = f"fork-server-kill-{os.getpid()}"
    parent = start(tmp_path, True, "--sleep", token=token)
    try:
        wait_running(parent)
        job = [pid for pid in pids_of_job(token) if pid != parent.pid]
        ranks = [pid for pid in job if rank_number(pid) is not None]
        (agent,) = children_of(parent.pid)
        assert len(ranks) == 2 and len(job) >= 4, job  # agent, server, ranks (and a tracker)
        os.kill(agent, signal.SIGKILL)
        assert gone(job), [pid for pid in job if Path(f"/proc/{pid}").exists()]
    finally:
        os.killpg(parent.pid, signal.SIGKILL)
        parent.communicate(timeout=60)


def test_what_the_server_preloads_follows_the_script(tmp_path):
    (tmp_path / "helper.py").write_text("import numpy\nfrom . import sibling\n")
    script = tmp_path / "train.py"
    script.write_text("import requests\nimport helper\nfrom transformers import LlamaConfig\n"
                      "import meshtrain_runtime as mt\nloss = mt.forward_backward(requests.x)\n"
                      "import torch.sagemaker as tsm\n")
    modules = rank_preload.preload_modules(script)
    assert modules[:len(rank_preload.RANK_MODULES)] == list(rank_preload.RANK_MODULES)
    extra = modules[len(rank_preload.RANK_MODULES):]
    assert extra == ["transformers.modeling_utils", "transformers", "transformers:LlamaConfig",
                     "meshtrain_runtime", "meshtrain_runtime.compat.smp",
                     "meshtrain_runtime:forward_backward", "numpy"]
    script.write_text("this is not Python (\n")
    assert rank_preload.preload_modules(script) == list(rank_preload.RANK_MODULES)


@pytest.mark.parametrize("gpus, start_method, forks", [
    (0, None, True), (0, "exec", False), (1, None, False), (0, "fork", True)])
def test_only_hosts_without_gpus_fork_their_ranks(gpus, start_method, forks):
    env = {} if start_method is None else {"MESHTRAIN_RANK_START": start_method}
    assert fork_server.forks_ranks(gpus, env) is forks


def test_the_socket_folder_is_the_runs_own_and_short_enough(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", None)
    short = Path(tempfile.mkdtemp(prefix="mt-test-", dir="/tmp"))
    monkeypatch.setenv("TMPDIR", str(short))
    environment = {"MESHTRAIN_RANK_PRELOAD": "torch"}
    try:
        with fork_server.server_folder(environment):
            folder = Path(environment["MESHTRAIN_FORK_SERVER_DIR"])
            assert folder.parent == short and folder.is_dir()
            (folder / "pymp-1").mkdir()  # what the agent leaves when it is killed
        assert not folder.exists()
    finally:
        short.rmdir()
    long = tmp_path / ("x" * 80)
    long.mkdir()
    monkeypatch.setenv("TMPDIR", str(long))
    monkeypatch.setattr(tempfile, "tempdir", None)  # gettempdir() reads TMPDIR again
    with fork_server.server_folder(environment):
        assert Path(environment["MESHTRAIN_FORK_SERVER_DIR"]).parent == Path("/tmp")
    plain: dict[str, str] = {}
    with fork_server.server_folder(plain):  # ranks of their own: no server, no folder
        assert plain == {}
