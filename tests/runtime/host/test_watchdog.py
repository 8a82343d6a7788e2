"""The hang watchdog: which stuck rank is the cause, what it records, how the key travels."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import traceback

from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.failures import RankFailure, pick_root_cause
from meshtrain_runtime.host.watchdog import in_collective


def stack(*files: str, name: str = "f") -> traceback.StackSummary:
    return traceback.StackSummary.from_list([(f, 1, name, "") for f in files])


def test_a_rank_inside_torch_distributed_or_autograd_is_waiting_in_a_collective():
    site = "/venv/lib/python3.11/site-packages/torch"
    assert in_collective(stack("/job/train.py", f"{site}/distributed/distributed_c10d.py"))
    assert in_collective(stack("/job/train.py", f"{site}/autograd/graph.py"))
    assert not in_collective(stack("/job/train.py", "/usr/lib/python3.11/threading.py"))


def test_the_launch_below_the_script_is_not_a_collective():
    """A forked rank's stack starts in torchrun's code (torch/distributed/run.py, elastic's
    process wrapper): only what runs above the rank wrapper's call of the script counts."""
    site = "/venv/lib/python3.11/site-packages"
    launch = stack(f"{site}/torch/distributed/run.py", f"{site}/torch/distributed/elastic/"
                   "multiprocessing/api.py", name="_wrap")
    wrapper = stack(f"{site}/meshtrain_runtime/host/rank_entry.py", name="run_entry_point")
    sleeping = stack("<frozen runpy>", "/job/train.py", "/usr/lib/python3.11/threading.py")
    waiting = stack("/job/train.py", f"{site}/torch/distributed/distributed_c10d.py")
    assert not in_collective(traceback.StackSummary.from_list([*launch, *wrapper, *sleeping]))
    assert in_collective(traceback.StackSummary.from_list([*launch, *wrapper, *waiting]))
    assert in_collective(launch)  # no wrapper on the stack: every frame counts


PROBE = textwrap.dedent("""
    import os, time
    from meshtrain_runtime.host import watchdog
    os.environ["MESHTRAIN_HANG_TIMEOUT"] = "0.5"
    watchdog.start_from_env()
    time.sleep(1.5)  # start-up slower than the timeout: not a hang, the clock is not running
    watchdog.progress()  # the first step
    time.sleep(30)  # the stuck line
""")


def run_probe(tmp_path, source: str) -> subprocess.CompletedProcess:
    env = {"RANK": "1", "MESHTRAIN_RANK_ERROR_DIR": str(tmp_path), "SM_CURRENT_HOST": "algo-2",
           "PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path)}
    script = tmp_path / "probe.py"
    script.write_text(source)
    return subprocess.run([sys.executable, str(script)], env=env, capture_output=True,
                          text=True, timeout=60)


def test_a_stuck_rank_records_its_stack_and_exits(tmp_path):
    done = run_probe(tmp_path, PROBE)
    assert done.returncode == 1
    record = json.loads((tmp_path / "rank-1.json").read_text())
    assert record["message"].startswith("Hang: no progress for 0.5 s and not in a collective")
    assert "time.sleep(30)" in record["traceback"] and record["host"] == "algo-2"
    assert "time.sleep(30)" in done.stderr
    assert "time.sleep(1.5)" not in record["traceback"]


def test_start_up_before_the_first_progress_is_not_a_hang(tmp_path):
    """Imports, model building and the first step's compile may take longer than the timeout."""
    slow_start = PROBE.replace("watchdog.progress()  # the first step\n", "").replace(
        "time.sleep(30)  # the stuck line", "print('started')")
    done = run_probe(tmp_path, slow_start)
    assert done.returncode == 0, done.stderr
    assert "started" in done.stdout and not (tmp_path / "rank-1.json").exists()


def test_the_waiting_rank_is_a_consequence_and_the_stuck_one_the_root_cause():
    waiting = RankFailure("algo-1", 0, 1.0, "exception",
                          "Hang: no progress for 10 s, waiting in a collective for a peer")
    stuck = RankFailure("algo-1", 1, 2.0, "exception",
                        "Hang: no progress for 10 s and not in a collective")
    root, others = pick_root_cause([waiting, stuck])
    assert root is stuck and others == [waiting]


def test_hang_timeout_travels_as_a_framework_parameter():
    config = DistributionConfig.from_dict({"torch_distributed": {"enabled": True,
                                                                 "hang_timeout": 30}})
    encoded = hp.encode_distribution(config, "local")
    assert encoded[hp.HANG_TIMEOUT] == 30
    _, framework, user = hp.split_hyperparameters(encoded)
    assert hp.HANG_TIMEOUT in framework and not user  # never a script argument
    assert DistributionConfig.from_dict(hp.decode_distribution(framework, user)) == config


STARTUP_PROBE = textwrap.dedent("""
    import os, time
    from meshtrain_runtime.host import watchdog
    os.environ["MESHTRAIN_HANG_TIMEOUT"] = "0.5"
    os.environ["MESHTRAIN_STARTUP_TIMEOUT"] = "1"
    watchdog.start_from_env()
    time.sleep(30)  # stuck before the first progress
""")


def test_the_start_up_allowance_ends_a_rank_that_never_makes_progress(tmp_path):
    done = run_probe(tmp_path, STARTUP_PROBE)
    assert done.returncode == 1
    record = json.loads((tmp_path / "rank-1.json").read_text())
    assert record["message"].startswith("Hang: no progress in the 1 s start-up allowance")
    assert "time.sleep(30)" in record["traceback"]


def test_the_default_start_up_allowance_is_longer_than_the_hang_timeout():
    from meshtrain_runtime.host.watchdog import default_startup_timeout

    assert default_startup_timeout(30) == 600  # docs/local-jobs.md: max(600 s, 10 x timeout)
    assert default_startup_timeout(120) == 1200


# A loop without torch.optim: backward passes, then collectives, each followed by a pause
# longer than the hang timeout in total but shorter per step. Were either not progress, the
# report would point at a pause inside the loop instead of the stuck line.
PROGRESS_PROBE = textwrap.dedent("""
    import os, tempfile, time
    from meshtrain_runtime.host import watchdog
    os.environ["MESHTRAIN_HANG_TIMEOUT"] = "1"
    os.environ["MESHTRAIN_STARTUP_TIMEOUT"] = "60"
    watchdog.start_from_env()
    import torch  # imported after the watchdog started, as in a job
    import torch.distributed as dist
    watchdog.progress()  # armed: from here on the 1 s timeout counts
    weight = torch.ones(3, requires_grad=True)
    for _ in range(6):
        (weight * 2).sum().backward()
        time.sleep(0.4)  # pause after a backward pass
    dist.init_process_group("gloo", init_method="file://" + tempfile.mktemp(), rank=0,
                            world_size=1)
    for _ in range(6):
        dist.all_reduce(weight.grad)
        time.sleep(0.4)  # pause after a collective
    time.sleep(30)  # the stuck line
""")


def test_backward_passes_and_collectives_are_progress(tmp_path):
    done = run_probe(tmp_path, PROGRESS_PROBE)
    assert done.returncode == 1, done.stderr
    record = json.loads((tmp_path / "rank-1.json").read_text())
    assert "time.sleep(30)" in record["traceback"], record["traceback"]
