"""`meshtrain status|stop|describe|logs|plot JOB`: find a job on any backend (meshtrain.registry)
and act on it; `list|rm|prune` live in meshtrain.cli_list."""

from __future__ import annotations

import argparse
import json
import time
from typing import Any

from meshtrain.cli_list import add_list_commands
from meshtrain.cli_lookup import add_location, find_job
from meshtrain.cli_views import add_view_commands, describe_job, plot_job, print_logs, seconds
from meshtrain.contract.hyperparameters import decode_hyperparameters
from meshtrain.job import TERMINAL_STATUSES, TrainingJob
from meshtrain.progress import progress_of_log


def add_job_commands(sub: argparse._SubParsersAction) -> None:
    """Register status, stop, describe, logs, plot, list, rm and prune."""
    for name, help_text in (("status", "print a job's DescribeTrainingJob and its training "
                                       "progress as JSON"),
                            ("describe", "a readable view of a job: status, reason, times, "
                                         "layout, progress, where its model is"),
                            ("stop", "stop a running job")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("job_name")
        if name == "status":
            command.add_argument("--json", action="store_true",
                                 help="JSON (the default; `meshtrain describe` reads better)")
        add_location(command)
        command.set_defaults(handler=job_command, action=name)
    add_view_commands(sub, add_location, job_command)
    add_list_commands(sub, add_location)


def job_command(args: argparse.Namespace) -> int:
    job = find_job(args)
    if args.action in ("status", "describe"):
        description = job.describe()
        description["Progress"] = progress_record(job, description)
        if args.action == "describe":
            describe_job(description)
        else:
            print(json.dumps(description, indent=2, default=str))
    elif args.action == "logs":
        print_logs(job, args)
    elif args.action == "plot":
        plot_job(job, args)
    else:
        stop_job(job)
    return 0


def stop_job(job: TrainingJob) -> None:
    """Stop `job` and say what happened (already ended, stopped, or stop requested); another
    user's job is refused before anything is looked at."""
    job.check_owner("stop")
    status = job.status
    if status in TERMINAL_STATUSES:
        leftover = job.end_leftover_processes()
        done = f"ended {leftover} process(es) it left behind" if leftover else "nothing to stop"
        print(f"job {job.job_name} already ended ({status}); {done}.")
        return
    print(f"Stopping job {job.job_name} ... ", end="", flush=True)
    job.stop()
    status = job.status
    if status == "Stopped":
        print("stopped")
    elif status in TERMINAL_STATUSES:
        print(f"it ended as {status}: see `meshtrain status {job.job_name}`")
    else:  # SageMaker stops asynchronously
        print(f"stop requested (status: {status})")


def progress_record(job: TrainingJob, description: dict[str, Any]) -> dict[str, Any]:
    """What the job's metric lines say (meshtrain.progress), for `meshtrain status`."""
    start = description.get("TrainingStartTime")
    end = description.get("TrainingEndTime") or time.time()
    training = seconds(end) - seconds(start) if start is not None else None
    hyperparameters = decode_hyperparameters(description.get("HyperParameters") or {})
    running = description.get("TrainingJobStatus") not in TERMINAL_STATUSES
    progress = progress_of_log(job.log_lines(), hyperparameters,
                               training_seconds=training if running else None)
    return {"Step": progress.step, "TotalSteps": progress.total_steps, "Loss": progress.loss,
            "TokensPerSecond": progress.tokens_per_sec, "MFU": progress.mfu,
            "EtaSeconds": progress.eta_seconds, "Summary": progress.summary()}
