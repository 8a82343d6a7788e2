"""`meshtrain slurm render ENTRY_POINT ... > job.sbatch`: the sbatch script of a job, for people
who submit by hand. The job directory is made as fit() makes it; `sbatch job.sbatch` runs it and
`meshtrain status|logs|stop NAME` follow it like any Slurm job."""

from __future__ import annotations

import argparse
import sys

from meshtrain.cli_args import channel_arg, json_object_arg


def register(sub: argparse._SubParsersAction) -> None:
    """Add `meshtrain slurm render` to the CLI."""
    slurm = sub.add_parser("slurm", help="Slurm sbatch scripts")
    actions = slurm.add_subparsers(dest="slurm_command", required=True)
    render = actions.add_parser("render", help="print the sbatch script of a job (its job "
                                               "directory is made now) for `sbatch` by hand")
    render.add_argument("entry_point")
    render.add_argument("--source-dir")
    render.add_argument("--instance-count", type=int, default=1)
    render.add_argument("--distribution", type=json_object_arg, help="the distribution as JSON")
    render.add_argument("--hyperparameters", type=json_object_arg, default={})
    render.add_argument("--input", action="append", default=[], metavar="CHANNEL=PATH",
                        type=channel_arg, help="an input channel, e.g. train=/shared/data "
                        "(repeatable; a path every node sees)")
    render.add_argument("--job-name")
    render.add_argument("--jobs-dir", help="on the cluster's shared filesystem "
                                           "(default ~/.meshtrain/jobs)")
    render.add_argument("--output-path")
    render.add_argument("--max-run", type=int, default=24 * 60 * 60)
    for option in ("partition", "account", "qos", "constraint"):
        render.add_argument(f"--{option}")
    render.add_argument("--gpus-per-node", type=int)
    render.add_argument("--sbatch-arg", action="append", default=[], dest="sbatch_args",
                        help="an extra sbatch flag (repeatable), e.g. --sbatch-arg=--exclusive")
    render.set_defaults(handler=_render)


def _render(args: argparse.Namespace) -> int:
    from meshtrain.estimator import Estimator

    options = {name: getattr(args, name) for name in (
        "jobs_dir", "partition", "account", "qos", "constraint", "gpus_per_node", "sbatch_args")
        if getattr(args, name)}
    estimator = Estimator(entry_point=args.entry_point, source_dir=args.source_dir,
                          instance_type="slurm", instance_count=args.instance_count,
                          distribution=args.distribution, hyperparameters=args.hyperparameters,
                          output_path=args.output_path, max_run=args.max_run, **options)
    spec = estimator.build_spec(dict(args.input) or None, job_name=args.job_name)
    sys.stdout.write(estimator.backend.render_job(spec))
    return 0
