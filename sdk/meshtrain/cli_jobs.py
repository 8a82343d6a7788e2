"""`meshtrain list|status|logs|stop`: find a job (local first, then SageMaker) and act on it."""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

from meshtrain.cli_views import add_view_commands, plot_job, print_logs
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import decode_hyperparameters
from meshtrain.job import TERMINAL_STATUSES, TrainingJob
from meshtrain.progress import progress_of_log

LIST_LIMIT = 50


def add_job_commands(sub: argparse._SubParsersAction) -> None:
    """Register list, status, logs and stop."""
    for name, help_text in (("status", "print a job's DescribeTrainingJob and its training "
                                       "progress as JSON"),
                            ("stop", "stop a running job")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("job_name")
        _add_location(command)
        command.set_defaults(handler=job_command, action=name)
    listing = sub.add_parser("list", help="list local jobs, newest first (--sagemaker: remote)")
    _add_location(listing)
    listing.add_argument("--sagemaker", action="store_true",
                         help="list SageMaker training jobs (boto3's AWS configuration)")
    listing.add_argument("--max", type=_positive_int, default=LIST_LIMIT, metavar="N",
                         help=f"show at most N jobs (default {LIST_LIMIT})")
    listing.set_defaults(handler=list_jobs)
    add_view_commands(sub, _add_location, job_command)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _add_location(command: argparse.ArgumentParser) -> None:
    command.add_argument("--jobs-dir", help="where local jobs live (default: $MESHTRAIN_HOME/jobs"
                                            " or ~/.meshtrain/jobs)")
    command.add_argument("--region", help="AWS region for SageMaker jobs (default: boto3's)")


def _local_backend(args: argparse.Namespace) -> Any:
    from meshtrain.backends.local import LocalBackend

    return LocalBackend(jobs_dir=args.jobs_dir)


def _aws_session(region: str | None) -> Any | None:
    """A boto3 session when AWS is configured (a region and credentials), else None."""
    try:
        import boto3
    except ImportError:
        return None
    session = boto3.Session(region_name=region) if region else boto3.Session()
    if not session.region_name or session.get_credentials() is None:
        return None
    return session


def find_job(args: argparse.Namespace) -> TrainingJob:
    """The local job named `args.job_name`, else the SageMaker one; ConfigError if neither."""
    local = _local_backend(args)
    if local.job_directory(args.job_name).spec_file.exists():
        return local.attach(args.job_name)
    missing = f"no local job {args.job_name} under {local.jobs_dir}"
    session = _aws_session(args.region)
    if session is None:
        raise ConfigError(f"{missing}; for SageMaker jobs pass --region / configure AWS.")
    from meshtrain.backends.sagemaker import SageMakerBackend

    try:
        return SageMakerBackend(boto_session=session).attach(args.job_name)
    except ConfigError as error:
        raise ConfigError(f"{missing}, and {error}") from None


def job_command(args: argparse.Namespace) -> int:
    job = find_job(args)
    if args.action == "status":
        description = job.describe()
        description["Progress"] = progress_record(job, description)
        print(json.dumps(description, indent=2, default=str))
    elif args.action == "logs":
        print_logs(job, args)
    elif args.action == "plot":
        plot_job(job, args)
    else:
        stop_job(job)
    return 0


def stop_job(job: TrainingJob) -> None:
    """Stop `job` and say what happened (already ended, stopped, or stop requested)."""
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
    training = _seconds(end) - _seconds(start) if start is not None else None
    hyperparameters = decode_hyperparameters(description.get("HyperParameters") or {})
    running = description.get("TrainingJobStatus") not in TERMINAL_STATUSES
    progress = progress_of_log(job.log_lines(), hyperparameters,
                               training_seconds=training if running else None)
    return {"Step": progress.step, "TotalSteps": progress.total_steps, "Loss": progress.loss,
            "TokensPerSecond": progress.tokens_per_sec, "MFU": progress.mfu,
            "EtaSeconds": progress.eta_seconds, "Summary": progress.summary()}


def _duration(start: Any, end: Any) -> str:
    seconds = _seconds(end) - _seconds(start) if start is not None and end is not None else None
    if seconds is None or seconds < 0:
        return "-"
    minutes, secs = divmod(int(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}h{minutes:02d}m{secs:02d}s" if hours else f"{minutes}m{secs:02d}s"


def _seconds(value: Any) -> float:
    return value.timestamp() if hasattr(value, "timestamp") else float(value)


def _when(value: Any) -> str:
    if value is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(_seconds(value)))


def _local_rows(args: argparse.Namespace) -> list[tuple[str, str, Any, str]]:
    local = _local_backend(args)
    jobs_dir = Path(local.jobs_dir)
    rows = []
    for spec_file in jobs_dir.glob("*/spec.json") if jobs_dir.is_dir() else []:
        job = local.attach(spec_file.parent.name)
        try:
            status = job.job_dir.read_status()
            if status.get("TrainingJobStatus") not in TERMINAL_STATUSES:
                status = job.describe()  # notices a supervisor that died
        except (OSError, ValueError):
            continue  # a job directory being created or removed right now
        end = status.get("TrainingEndTime") or time.time()
        rows.append((job.job_name, status.get("TrainingJobStatus", "?"),
                     status.get("CreationTime"), _duration(status.get("CreationTime"), end)))
    return sorted(rows, key=lambda row: row[2] or 0, reverse=True)


def _sagemaker_rows(args: argparse.Namespace) -> list[tuple[str, str, Any, str]]:
    session = _aws_session(args.region)
    if session is None:
        raise ConfigError("meshtrain list --sagemaker needs AWS: pass --region and configure "
                          "credentials (AWS_PROFILE, ~/.aws/credentials or the environment).")
    client = session.client("sagemaker")
    response = client.list_training_jobs(SortBy="CreationTime", SortOrder="Descending",
                                         MaxResults=min(args.max, 100))
    rows = []
    summaries = sorted(response.get("TrainingJobSummaries", []),  # not every endpoint sorts
                       key=lambda job: _seconds(job["CreationTime"]), reverse=True)
    for job in summaries:
        end = job.get("TrainingEndTime") or (job.get("LastModifiedTime")
                                             if job["TrainingJobStatus"] in TERMINAL_STATUSES
                                             else time.time())
        rows.append((job["TrainingJobName"], job["TrainingJobStatus"], job.get("CreationTime"),
                     _duration(job.get("CreationTime"), end)))
    return rows


def list_jobs(args: argparse.Namespace) -> int:
    """Print jobs newest first: name, status, creation time and duration (so far)."""
    rows = (_sagemaker_rows(args) if args.sagemaker else _local_rows(args))[: args.max]
    if not rows:
        where = "on SageMaker" if args.sagemaker else f"under {_local_backend(args).jobs_dir}"
        print(f"no jobs {where}")
        return 0
    width = max(len(row[0]) for row in rows)
    print(f"{'NAME':<{width}}  {'STATUS':<10}  {'CREATED':<19}  DURATION")
    for name, status, created, duration in rows:
        print(f"{name:<{width}}  {status:<10}  {_when(created):<19}  {duration}")
    sys.stdout.flush()
    return 0
