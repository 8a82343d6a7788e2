"""Goodput of a fault-tolerant local job with one injected failure per minute (issue 36).

One Estimator job on this machine: 2 hosts x 2 processes, hybrid_shard_degree 2,
``fault_tolerance: {"replica_groups": 2}``, the plain hybrid-sharded script
tests/e2e/scripts/ft_hsdp_train.py (no checkpoint; each step waits --delay seconds for its
"data"). Once both groups have committed a step, one rank of a replica group is SIGKILLed in
the middle of every --every seconds (group 1, then 0, then 1 ...; a kill waits until the previous
victim has rejoined, so a live peer always exists to heal from). After --minutes, once the last
victim is back, the script is told to stop 3 steps later. What is printed (and written with
--json) is the job's own describe()["FaultTolerance"]: Goodput (committed replica-steps /
(replica groups x committed steps)) and one recovery per failure (DownSeconds, StepsWithoutIt,
RejoinSecondsAfterRestart), with the load average, and beside the job's time view the planner's
estimate (``meshtrain plan --goodput``) for the same failure rate and the times the job measured
(describe()["FaultTolerance"]["Measured"]): the model checked against a real job.

    OMP_NUM_THREADS=1 python benchmarks/bench_goodput.py [--minutes 5] [--every 60] [--json F]
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tempfile
import time
from pathlib import Path
from typing import Any

from meshtrain import Estimator
from meshtrain.backends.hosts.ft_metrics import read_step_records, step_participants
from meshtrain.backends.hosts.processes import rank_pids_of_job
from meshtrain.contract import env as names
from meshtrain.plan.goodput import GoodputInputs, estimate_goodput

SCRIPT_DIR = Path(__file__).resolve().parents[1] / "tests" / "e2e" / "scripts"
SHARD, GROUPS = 2, 2


def distribution(restarts: int) -> dict[str, Any]:
    return {"torch_distributed": {"enabled": True, "processes_per_host": SHARD,
                                  "max_restarts": restarts,
                                  "fault_tolerance": {"replica_groups": GROUPS}},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": SHARD}}}}


def load() -> str:
    return " / ".join(f"{value:.2f}" for value in os.getloadavg())


def rank_pid(token: str, group: int) -> int | None:
    """One rank of replica group `group`, found among the job's processes."""
    mark = f"{names.MESHTRAIN_FT_REPLICA_GROUP}={group}".encode()
    for pid in sorted(rank_pids_of_job(token)):
        try:
            if mark in Path(f"/proc/{pid}/environ").read_bytes().split(b"\0"):
                return pid
        except OSError:
            continue
    return None


def figures(job: Any) -> dict[str, Any]:
    return job.describe()["FaultTolerance"]


def all_live(job: Any) -> bool:
    summary = figures(job)
    return (summary["CommittedSteps"] > 0 and summary["LiveReplicaGroups"] == GROUPS
            and all(r["Rejoined"] for r in summary["Recoveries"]))


def wait_until(condition, job: Any, seconds: float = 600) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        status = job.job_dir.read_status()["TrainingJobStatus"]
        if status != "InProgress" or time.monotonic() > deadline:
            raise RuntimeError(f"job {status} while waiting; see {job.job_dir.log_file}")
        time.sleep(0.5)


def inject(job: Any, minutes: float, every: float) -> list[dict[str, Any]]:
    """SIGKILL one rank every `every` seconds, alternating groups; the kills' times."""
    wait_until(lambda: all_live(job), job)
    started, kills, victim = time.monotonic(), [], 1
    while True:
        target = started + every * (len(kills) + 0.5)  # one kill in each minute, mid-minute
        if target >= started + minutes * 60:
            break
        time.sleep(max(0.0, target - time.monotonic()))
        wait_until(lambda: all_live(job), job)
        pid = rank_pid(job.token, victim)
        if pid is None:
            raise RuntimeError(f"no rank of replica group {victim} among the job's processes")
        os.kill(pid, signal.SIGKILL)
        kills.append({"ReplicaGroup": victim, "KilledAt": time.time(), "Pid": pid})
        victim = 1 - victim
    time.sleep(max(0.0, started + minutes * 60 - time.monotonic()))
    return kills


def run(args: argparse.Namespace) -> dict[str, Any]:
    home = Path(tempfile.mkdtemp(prefix="bench-goodput-"))
    shared = home / "shared"
    shared.mkdir()
    kills_expected = int(args.minutes * 60 // args.every)
    estimator = Estimator(
        "ft_hsdp_train.py", source_dir=str(SCRIPT_DIR), instance_count=2,
        jobs_dir=str(home / "jobs"), max_run=int(args.minutes * 60 * 3),
        distribution=distribution(kills_expected), environment={"FT_TEST_DIR": str(shared)},
        hyperparameters={"max-steps": 1_000_000, "delay": args.delay})
    load_before, wall = load(), time.monotonic()
    job = estimator.fit(wait=False, job_name="goodput")
    try:
        kills = inject(job, args.minutes, args.every)
        wait_until(lambda: all_live(job), job)  # the last victim back: both groups end together
        last = figures(job)["CommittedSteps"]
        (shared / "stop-at").write_text(str(last + 3))
        job.wait(logs=False)
    finally:
        if job.job_dir.read_status()["TrainingJobStatus"] == "InProgress":
            job.stop()
    description = job.describe()
    return {"status": description["TrainingJobStatus"], "wall_seconds": time.monotonic() - wall,
            "load_before": load_before, "load_after": load(), "kills": kills,
            "fault_tolerance": description["FaultTolerance"], "job_dir": str(job.job_dir.root),
            "time_view": time_goodput(job.job_dir.root),
            "planned": planned(description["FaultTolerance"], args.every),
            "minutes": args.minutes, "every": args.every, "delay": args.delay}


def planned(figures: dict[str, Any], every: float) -> dict[str, Any]:
    """The planner's goodput for this job: 4 ranks failing once per `every` seconds, with the
    restart, heal and stall the job measured (no checkpoints: the groups never all failed)."""
    measured = figures["Measured"]
    inputs = GoodputInputs(
        gpus=SHARD * GROUPS, gpu_mtbf_hours=every * SHARD * GROUPS / 3600.0,
        replica_groups=GROUPS, group_restart_seconds=measured["GroupRestartSeconds"] or 0.0,
        heal_seconds=measured["HealSeconds"] or 0.0, stall_seconds=measured["StallSeconds"] or 0.0,
        checkpoint_write_seconds=0.0)
    return {"Goodput": round(estimate_goodput(inputs).replica_groups.goodput, 4),
            "Inputs": {k: v for k, v in inputs.__dict__.items() if k != "measured"}}


def time_goodput(job_root: Path, groups: int = GROUPS) -> dict[str, float]:
    """The time view: replica-steps done / (groups x the steps the span would hold at the pace
    of steps every group took part in). Unlike Goodput it also counts the stall of the
    survivors (torchft's heartbeat timeout) while a group that comes back at once is missed."""
    records = read_step_records(sorted(job_root.glob("hosts/*/opt/ml/output/data")))
    steps = step_participants(records)
    times = {int(r["step"]): float(r["time"]) for r in records if r.get("committed")}
    full = sorted(s for s, members in steps.items() if len(members) == groups)
    paces = sorted(times[s] - times[s - 1] for s in full if s - 1 in times and s - 1 in full)
    span = times[max(times)] - times[min(times)]
    pace = paces[len(paces) // 2]
    replica_steps = sum(len(members) for members in steps.values())
    return {"TimeGoodput": round(replica_steps / (groups * (span / pace + 1)), 4),
            "SpanSeconds": round(span, 1), "FullStepSeconds": round(pace, 4)}


def markdown(result: dict[str, Any]) -> str:
    ft = result["fault_tolerance"]
    lines = [f"Status {result['status']}, wall {result['wall_seconds']:.0f} s, "
             f"{ft['CommittedSteps']} committed steps, Goodput **{ft['Goodput']:.3f}** "
             f"({ft['ReplicaSteps']} of {ft['ReplicaGroups'] * ft['CommittedSteps']} "
             "replica-steps); time view "
             f"{result['time_view']['TimeGoodput']:.3f} (a {result['time_view']['SpanSeconds']} s "
             f"span at {result['time_view']['FullStepSeconds']} s per full step). Load average "
             f"{result['load_before']} before, {result['load_after']} after.", "",
             "| failure | group | down s | steps without it | rejoin s after restart |",
             "|---|---|---|---|---|"]
    for number, recovery in enumerate(ft["Recoveries"], 1):
        lines.append(f"| {number} | {recovery['ReplicaGroup']} | {recovery['DownSeconds']} | "
                     f"{recovery['StepsWithoutIt']} | {recovery['RejoinSecondsAfterRestart']} |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--minutes", type=float, default=5.0)
    parser.add_argument("--every", type=float, default=60.0, help="seconds between failures")
    parser.add_argument("--delay", type=float, default=0.2, help="seconds of data per step")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()
    result = run(args)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2))
    print(markdown(result))


if __name__ == "__main__":
    main()
