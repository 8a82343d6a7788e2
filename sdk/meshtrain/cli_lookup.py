"""How every job command finds its job: the location flags of each backend and the lookup
through the job registry (meshtrain.registry)."""

from __future__ import annotations

import argparse
from typing import Any

from meshtrain.job import TrainingJob
from meshtrain.targets import backend_kinds

BACKENDS = tuple(kind.name for kind in backend_kinds())


def add_location(command: argparse.ArgumentParser) -> None:
    """Where to look for jobs: each backend's own flags, and --backend to search one."""
    command.add_argument("--jobs-dir", help="where local and Docker jobs live (default: "
                                            "$MESHTRAIN_HOME/jobs or ~/.meshtrain/jobs)")
    command.add_argument("--region", help="AWS region for SageMaker jobs (default: boto3's)")
    command.add_argument("--namespace", help="Kubernetes namespace (default: default)")
    command.add_argument("--kubeconfig", help="Kubernetes config file (default: $KUBECONFIG "
                                              "or ~/.kube/config)")
    command.add_argument("--kube-context", help="Kubernetes context (default: the current one)")
    command.add_argument("--backend", choices=BACKENDS,
                         help="search this backend only (default: every one that answers)")


def lookup_options(args: argparse.Namespace) -> dict[str, Any]:
    """The backends' options the location flags give (each backend takes its own)."""
    options: dict[str, Any] = {"jobs_dir": args.jobs_dir}
    if args.region:
        import boto3

        options["boto_session"] = boto3.Session(region_name=args.region)
    for name in ("namespace", "kubeconfig", "kube_context"):
        options[name] = getattr(args, name, None)
    return {key: value for key, value in options.items() if value is not None}


def find_job(args: argparse.Namespace) -> TrainingJob:
    """The job named `args.job_name` on whichever backend has it (meshtrain.registry):
    ConfigError naming where it looked, what it could not search and the closest name."""
    from meshtrain.registry import find_job as find

    return find(args.job_name, args.backend, **lookup_options(args)).job
