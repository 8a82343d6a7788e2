"""Kill a rank of a fault-tolerant job and watch the job recover by itself.

    python examples/fault_tolerance/launch.py [--steps 240] [--step-seconds 0.25]
        [--kill-at 10] [--plot steps.png]

One local job, 2 hosts x 2 processes, hybrid sharding over each host's 2 ranks, and the docs'
lead example: ``fault_tolerance: {"replica_groups": 2}``, nothing else (each host is a replica
group; a failed group gets 3 restarts by default). train.py is a plain loop. Once group 1 has
committed --kill-at steps, this launcher SIGKILLs one of its ranks (as a crashed process or a
lost GPU would end it), then only watches:

- the job log's own lines: the failure, the restart of group 1 alone, its heal from group 0 and
  the end (group 0 finishes its loop; group 1, whose loop began again from 0, stops);
- describe()["FaultTolerance"]: the goodput and the recovery (how long group 1 was down, how
  many steps group 0 took without it, how long group 0 went without a committed step);
- with --plot (needs matplotlib: pip install 'meshtrain[plot]'), the committed steps of each
  group over time, from the step records in the job's output.tar.gz.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import tarfile
import time
from pathlib import Path
from typing import Any

from meshtrain import Estimator

HERE = Path(__file__).parent
EVENTS = ("[meshtrain] replica group", "meshtrain: replica group")  # the job's own lines


def estimator(steps: int, step_seconds: float) -> Estimator:
    return Estimator(
        entry_point="train.py", source_dir=str(HERE), instance_type="local", instance_count=2,
        base_job_name="fault-tolerance",
        hyperparameters={"steps": steps, "step-seconds": step_seconds},
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2,
                                  "fault_tolerance": {"replica_groups": 2}},
            "smdistributed": {"modelparallel": {"enabled": True,
                                                "parameters": {"hybrid_shard_degree": 2}}},
        },
    )


def rank_of_group(job: Any, group: int, rank: int = 1) -> int | None:
    """The pid of replica group `group`'s rank `rank` (each process of the job carries its
    token and its group in its environment, and each rank names itself mt-rank-<RANK>, what
    ps shows; Linux, like torchft)."""
    wanted = {f"MESHTRAIN_JOB_TOKEN={job.token}".encode(),
              f"MESHTRAIN_FT_REPLICA_GROUP={group}".encode()}
    for entry in Path("/proc").iterdir():
        try:
            environ = set((entry / "environ").read_bytes().split(b"\0"))
            name = (entry / "comm").read_text().strip()
        except OSError:
            continue
        if wanted <= environ and name == f"mt-rank-{rank}":
            return int(entry.name)
    return None


def committed_steps(job: Any, group: int) -> int:
    """Steps group `group` has committed so far (its rank 0's step records)."""
    path = (job.job_dir.host_paths(f"algo-{group + 1}").output_data_dir / "fault_tolerance"
            / f"replica-{group}.jsonl")
    if not path.exists():
        return 0
    return sum(json.loads(line)["committed"] for line in path.read_text().splitlines() if line)


def kill_a_rank(job: Any, kill_at: int) -> float:
    """Wait for group 1 to commit `kill_at` steps, SIGKILL its rank 1; when."""
    while committed_steps(job, 1) < kill_at:
        if job.describe()["TrainingJobStatus"] != "InProgress":
            raise SystemExit(f"the job ended before step {kill_at}: see meshtrain logs {job.name}")
        time.sleep(0.2)
    pid = rank_of_group(job, 1)
    if pid is None:
        raise SystemExit("no rank 1 of replica group 1 among the job's processes")
    os.kill(pid, signal.SIGKILL)
    print(f"killed rank 1 of replica group 1 (pid {pid}) after {kill_at} committed steps")
    return time.time()


def report(job: Any, killed_at: float) -> None:
    print("\nWhat the job log says:")
    for line in job.log_lines():
        if any(event in line for event in EVENTS):
            print(f"  {line}")
    description = job.describe()
    figures = description["FaultTolerance"]
    print(f"\nJob {description['TrainingJobStatus']}: {figures['CommittedSteps']} committed "
          f"steps, goodput {figures['Goodput']:.1%} ({figures['GoodputDefinition']})")
    for recovery in figures["Recoveries"]:
        if not recovery["Rejoined"]:
            print(f"Group {recovery['ReplicaGroup']} was restarted, but group 0 finished its "
                  f"loop first ({recovery['StepsWithoutIt']} steps without it): on a loaded "
                  "machine the restart (imports, init) outlasts the steps left; try --steps 400")
            continue
        print(f"Group {recovery['ReplicaGroup']} down {recovery['DownSeconds']} s (back "
              f"{(recovery.get('RejoinedAt') or killed_at) - killed_at:.1f} s after the kill, "
              f"healed in {recovery.get('HealSeconds')} s), group 0 stepped "
              f"{recovery['StepsWithoutIt']} steps without it and went at most "
              f"{recovery['SurvivorGapSeconds']} s without a committed step")
    print(f"Model artifacts: {job.model_data} (from replica group "
          f"{figures.get('FinishedReplicaGroup')}, the one that finished)")


def step_records(job: Any) -> dict[int, list[tuple[float, int]]]:
    """(time, committed steps) of each group, from the job's output.tar.gz."""
    found: dict[int, list[tuple[float, int]]] = {}
    with tarfile.open(Path(job.model_data.removeprefix("file://")).with_name(
            "output.tar.gz")) as tar:
        for member in tar.getmembers():
            if member.name.startswith("fault_tolerance/replica-"):
                for line in tar.extractfile(member).read().decode().splitlines():
                    record = json.loads(line)
                    if record["committed"]:
                        found.setdefault(record["replica_group"], []).append(
                            (record["time"], record["step"] + 1))
    return {group: sorted(points) for group, points in found.items()}


def plot(job: Any, killed_at: float, path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("(no plot: pip install 'meshtrain[plot]' for matplotlib)")
        return
    records = step_records(job)
    start = min(t for points in records.values() for t, _ in points)
    figure, axes = plt.subplots(figsize=(7, 3.5))
    for group, points in sorted(records.items()):
        axes.plot([t - start for t, _ in points], [s for _, s in points], ".",
                  markersize=3, label=f"replica group {group}")
    axes.axvline(killed_at - start, color="red", linestyle="--", label="rank of group 1 killed")
    axes.set(xlabel="seconds", ylabel="committed steps", title="Steps per replica group")
    axes.legend()
    figure.tight_layout()
    figure.savefig(path)
    print(f"steps per group over time: {path}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=240)
    parser.add_argument("--step-seconds", type=float, default=0.25)
    parser.add_argument("--kill-at", type=int, default=10)
    parser.add_argument("--plot", type=Path)
    args = parser.parse_args()
    job = estimator(args.steps, args.step_seconds).fit(wait=False)
    print(f"job {job.name} started: 2 replica groups of 1 host x 2 processes")
    try:
        killed_at = kill_a_rank(job, args.kill_at)
        job.wait(logs=False)
    finally:
        if job.describe()["TrainingJobStatus"] == "InProgress":
            job.stop()
    report(job, killed_at)
    if args.plot:
        plot(job, killed_at, args.plot)


if __name__ == "__main__":
    main()
