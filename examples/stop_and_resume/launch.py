"""Stop a job mid-training, resume it in a new job, and survive a crashed rank.

    python examples/stop_and_resume/launch.py [--checkpoint-dir DIR] [--no-restart]

Every job is 2 hosts x 2 processes with hybrid sharding, training the same tiny model on the
same data (train.py):

1. uninterrupted: steps 0-9 straight through, the reference.
2. stopped: started with fit(wait=False); once a few steps are logged, job.stop(). The script
   sees meshtrain_runtime.stop_requested() on every rank, saves that step in DIR and exits:
   the job's status is Stopped.
3. resumed: a new job with the same checkpoint_local_path finds that checkpoint with
   latest_checkpoint() and trains the remaining steps.
4. restarted (unless --no-restart): torch_distributed.max_restarts=1; on attempt 1 the last rank
   SIGKILLs itself after step 4, every host is restarted, and attempt 2 resumes from the
   checkpoint of step 3 and completes.

At the end the losses of 2+3 and of 4 are compared with those of 1, step by step.
"""

from __future__ import annotations

import argparse
import re
import tempfile
import time
from pathlib import Path

from meshtrain import Estimator

HERE = Path(__file__).parent
STEPS, SAVE_EVERY, FAIL_AT = 10, 2, 4
STOP_AFTER = 2  # stop the second job once this step's loss is in its log
LOSS = re.compile(r"\[meshtrain metric\] train:loss=(\S+) step=(\d+)")
MARKER = "meshtrain-checkpoint.json"  # save_checkpoint writes it last
SAID = ("attempt ", "stop requested", "simulating a crash")  # what train.py says it did


def estimator(name: str, checkpoint_dir: Path | None = None, max_restarts: int = 0,
              **hyperparameters: float) -> Estimator:
    """A 2 hosts x 2 processes job of train.py (shard over each host's 2 ranks, 2 replicas)."""
    return Estimator(
        entry_point="train.py",
        source_dir=str(HERE),
        instance_type="local",
        instance_count=2,
        base_job_name=f"stop-resume-{name}",
        hyperparameters={"steps": STEPS, "save-every": SAVE_EVERY, **hyperparameters},
        checkpoint_local_path=str(checkpoint_dir) if checkpoint_dir else None,
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2,
                                  "max_restarts": max_restarts},
            "smdistributed": {"modelparallel": {"enabled": True,
                                                "parameters": {"hybrid_shard_degree": 2}}},
        },
    )


def losses_of(job) -> dict[int, float]:
    """step -> loss from the job's metric lines (a restarted step's later line wins)."""
    found = {}
    for line in job.log_lines():
        match = LOSS.search(line)
        if match:
            found[int(match.group(2))] = float(match.group(1))
    return found


def report(title: str, job) -> None:
    description = job.describe()
    reason = description.get("FailureReason")
    print(f"{title}: {job.name} {description['TrainingJobStatus']}"
          + (f" ({reason.splitlines()[0]})" if reason else ""))
    for line in job.log_lines():
        if any(said in line for said in SAID) and "[meshtrain]" not in line:
            print(f"  {line}")
    for failed in description.get("FailedAttempts", []):
        print(f"  attempt {failed['Attempt']} failed: {failed['FailureReason'].splitlines()[0]}")
    print(f"Model artifacts: {job.model_data}")


def stop_mid_training(checkpoints: Path):
    """Start a slow job, stop it once step STOP_AFTER is logged; returns the stopped job."""
    job = estimator("stopped", checkpoints, **{"step-seconds": 1.0}).fit(wait=False)
    deadline = time.monotonic() + 600
    while STOP_AFTER not in losses_of(job):
        if job.status in ("Completed", "Failed", "Stopped") or time.monotonic() > deadline:
            raise SystemExit(f"{job.name} ended before step {STOP_AFTER}: {job.status}")
        time.sleep(0.2)
    print(f"step {STOP_AFTER} logged: stopping {job.name}", flush=True)
    job.stop()  # SIGTERM to every rank; returns once the job is terminal
    return job


def show_checkpoints(folder: Path) -> None:
    """The step folders in `folder`; complete ones have the marker (written after every shard)."""
    for step in sorted(folder.glob("step_*")):
        shards = len(list(step.glob("*.distcp")))
        state = "complete" if (step / MARKER).exists() else "INCOMPLETE (no marker)"
        print(f"  {step.name}: {shards} shards, {state}")


def compare(name: str, losses: dict[int, float], reference: dict[int, float]) -> None:
    worst = max(abs(losses[step] - reference[step]) for step in losses)
    print(f"{name}: steps {min(losses)}-{max(losses)}, max |loss - uninterrupted| = {worst:.2e}")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--checkpoint-dir", type=Path, default=None,
                        help="checkpoint folder of jobs 2 and 3 (default: a new temporary one)")
    parser.add_argument("--no-restart", action="store_true", help="skip job 4")
    args = parser.parse_args()
    # without --checkpoint-dir: a temporary folder, removed at the end (even after a failure)
    with tempfile.TemporaryDirectory(prefix="meshtrain-ckpt-") as scratch:
        checkpoints = (args.checkpoint_dir or Path(scratch)).resolve()
        print(f"Checkpoints of the stopped and resumed jobs in {checkpoints}"
              + ("" if args.checkpoint_dir else " (removed at the end; --checkpoint-dir keeps "
                                                "them)"))
        run_jobs(checkpoints, restart=not args.no_restart)


def run_jobs(checkpoints: Path, *, restart: bool) -> None:
    """Jobs 1-4 (see the module docstring), then their losses compared."""
    uninterrupted = estimator("uninterrupted").fit(logs=False)
    report("1 uninterrupted", uninterrupted)
    stopped = stop_mid_training(checkpoints)
    report("2 stopped", stopped)
    show_checkpoints(checkpoints)
    resumed = estimator("resumed", checkpoints).fit(logs=False)
    report("3 resumed", resumed)
    reference = losses_of(uninterrupted)
    compare("stopped", losses_of(stopped), reference)
    compare("resumed", losses_of(resumed), reference)
    if restart:
        restarted = estimator("restarted", max_restarts=1, **{"fail-at-step": FAIL_AT}).fit(
            logs=False)
        report("4 restarted", restarted)
        compare("restarted", losses_of(restarted), reference)
    print(f"final loss: uninterrupted {reference[STEPS - 1]:.6f}, "
          f"stopped + resumed {losses_of(resumed)[STEPS - 1]:.6f}")


if __name__ == "__main__":
    main()
