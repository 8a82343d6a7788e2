"""`meshtrain list` (jobs with their status, script and why they ended; `--wide`: their layout
and source too), `meshtrain rm JOB` and `meshtrain prune` (ended jobs on this machine)."""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Callable
from typing import Any

from meshtrain.cli_lookup import lookup_options
from meshtrain.cli_views import duration_text, seconds, when_text
from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError
from meshtrain.job import TERMINAL_STATUSES, stop_reason
from meshtrain.job_layout import layout_brief

LIST_LIMIT = 50
REASON_WIDTH = 70


def add_list_commands(sub: argparse._SubParsersAction,
                      add_location: Callable[[argparse.ArgumentParser], None]) -> None:
    """Register list, rm and prune."""
    listing = sub.add_parser("list", help="list jobs on this machine (local and Docker), newest "
                                          "first; --sagemaker / --kubernetes: remote ones")
    add_location(listing)
    listing.add_argument("--sagemaker", action="store_true",
                         help="list SageMaker training jobs (boto3's AWS configuration)")
    listing.add_argument("--kubernetes", action="store_true",
                         help="list the Kubernetes jobs of --namespace (the kubeconfig's cluster)")
    listing.add_argument("--max", type=_positive_int, default=LIST_LIMIT, metavar="N",
                         help=f"show at most N jobs (default {LIST_LIMIT})")
    listing.add_argument("--wide", action="store_true",
                         help="also each job's layout (hosts x processes, mesh axes above 1) "
                              "and source, and reasons uncut")
    listing.set_defaults(handler=list_jobs)
    remove = sub.add_parser("rm", help="delete ended jobs on this machine (their directory: "
                                       "logs, model, checkpoints)")
    remove.add_argument("job_names", nargs="+", metavar="job_name")
    remove.add_argument("--jobs-dir", help="where local and Docker jobs live")
    remove.set_defaults(handler=remove_jobs)
    prune = sub.add_parser("prune", help="delete every ended job on this machine (optionally "
                                         "only those older than --older-than DAYS)")
    prune.add_argument("--older-than", type=float, default=0.0, metavar="DAYS",
                       help="keep jobs that ended less than DAYS days ago (default 0: none)")
    prune.add_argument("--dry-run", action="store_true", help="only say what would go")
    prune.add_argument("--jobs-dir", help="where local and Docker jobs live")
    prune.set_defaults(handler=prune_jobs)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if value < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {value}")
    return value


def _listed_kinds(args: argparse.Namespace) -> list[str]:
    if getattr(args, "backend", None):
        return [args.backend]
    remote = [name for name, flag in (("sagemaker", args.sagemaker),
                                      ("kubernetes", args.kubernetes)) if flag]
    return remote or [kind.name for kind in _machine_kinds()]


def _machine_kinds() -> list[Any]:
    from meshtrain.targets import backend_kinds

    # jobs kept under a jobs_dir this machine sees (local, Docker; Slurm's shared filesystem)
    return [kind for kind in backend_kinds()
            if kind.on_this_machine or "jobs_dir" in kind.options()]


def _summaries(kinds: list[str], options: dict[str, Any], limit: int) -> list[dict[str, Any]]:
    from meshtrain.backends import BackendUnreachable
    from meshtrain.registry import lookup_backends

    rows = []
    for name in kinds:
        for kind, backend in lookup_backends(name, **options):
            try:
                rows += backend.summaries(limit)
            except BackendUnreachable as why:
                raise ConfigError(f"meshtrain list: cannot list {kind.title} jobs: {why}."
                                  ) from None
    rows.sort(key=lambda row: seconds(row.get("CreationTime") or 0), reverse=True)
    return rows[:limit]


def reason_text(row: dict[str, Any], width: int | None = REASON_WIDTH) -> str:
    """Why a job ended as it did, on one line ("" for a completed or running job), cut to
    `width` characters (None: whole)."""
    if row.get("TrainingJobStatus") not in ("Failed", "Stopped"):
        return ""
    reason = stop_reason(row).removeprefix(": ").strip()
    first = reason.splitlines()[0] if reason else ""
    return first if width is None or len(first) <= width else first[: width - 3] + "..."


def _columns(row: dict[str, Any], wide: bool) -> list[str]:
    """One row's cells, REASON last (never padded)."""
    layout = row.get("Layout") or {}
    end = row.get("TrainingEndTime") or (row.get("LastModifiedTime")
                                         if row["TrainingJobStatus"] in TERMINAL_STATUSES
                                         else time.time())
    cells = [row["TrainingJobName"], row["TrainingJobStatus"],
             when_text(row.get("CreationTime")), duration_text(row.get("CreationTime"), end),
             layout.get("EntryPoint") or "-"]
    if wide:
        cells += [layout_brief(layout), layout.get("SourceDir") or "-"]
    return [*cells, reason_text(row, None if wide else REASON_WIDTH)]


def list_jobs(args: argparse.Namespace) -> int:
    """Print jobs newest first: name, status, creation time, duration (so far), script and
    reason; with --wide also the layout and the source."""
    kinds = _listed_kinds(args)
    rows = _summaries(kinds, lookup_options(args), args.max)
    if not rows:
        print(f"no jobs {_where(kinds, args)}")
        return 0
    wide = getattr(args, "wide", False)
    header = ["NAME", "STATUS", "CREATED", "DURATION", "SCRIPT"]
    header += ["LAYOUT", "SOURCE"] if wide else []
    table = [[*header, "REASON"], *(_columns(row, wide) for row in rows)]
    widths = [max(len(line[i]) for line in table) for i in range(len(header))]
    for line in table:  # REASON, last, is not padded
        cells = [cell.ljust(width) for cell, width in zip(line[:-1], widths, strict=True)]
        print("  ".join([*cells, line[-1]]).rstrip())
    sys.stdout.flush()
    return 0


def _where(kinds: list[str], args: argparse.Namespace) -> str:
    if kinds == ["sagemaker"]:
        return "on SageMaker"
    if kinds == ["kubernetes"]:
        return f"in Kubernetes namespace {args.namespace or 'default'}"
    from meshtrain.backends.hosts.layout import default_jobs_dir

    return f"under {args.jobs_dir or default_jobs_dir()}"


def _machine_backends(jobs_dir: str | None) -> list[Any]:
    from meshtrain.targets import backend_named

    options = {"jobs_dir": jobs_dir} if jobs_dir else {}
    return [backend_named(kind.name, **options) for kind in _machine_kinds()]


def remove_jobs(args: argparse.Namespace) -> int:
    """Delete each named ended job of this machine; a running or unknown one is an error
    (checked for every name before anything is deleted)."""
    backends = _machine_backends(args.jobs_dir)
    owners = []
    for name in args.job_names:
        owner = next((backend for backend in backends if backend.owns(name)), None)
        if owner is None:
            known = [job for backend in backends for job in backend.job_names()]
            raise ConfigError(f"{backends[0].not_found(name)} (rm deletes jobs on this machine "
                              f"only).{did_you_mean(name, known)}")
        owner.attach(name).check_owner("remove")  # another user's job is refused
        if owner.attach(name).status not in TERMINAL_STATUSES:
            raise ConfigError(f"job {name} is still running: stop it first (`meshtrain stop "
                              f"{name}`), then remove it.")
        owners.append((name, owner))
    for name, owner in owners:
        owner.remove(name)
        print(f"removed {name}")
    return 0


def prune_jobs(args: argparse.Namespace) -> int:
    """Delete every ended job of this machine that ended more than --older-than days ago."""
    cutoff = time.time() - args.older_than * 86400
    removed = 0
    for backend in _machine_backends(args.jobs_dir):
        for row in backend.summaries():
            ended = row.get("TrainingEndTime") or row.get("CreationTime") or 0
            if row["TrainingJobStatus"] not in TERMINAL_STATUSES or seconds(ended) > cutoff:
                continue
            if not args.dry_run:
                backend.remove(row["TrainingJobName"])
            print(f"{'would remove' if args.dry_run else 'removed'} {row['TrainingJobName']} "
                  f"({row['TrainingJobStatus']})")
            removed += 1
    if not removed:
        print("nothing to prune")
    return 0
