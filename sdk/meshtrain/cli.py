"""The `meshtrain` command: run a script as a job, look at jobs, plan a layout."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence

from meshtrain.errors import ConfigError, JobFailedError
from meshtrain.plan.cli import register as register_plan


def _json_arg(text: str) -> dict:
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a training script as a job (Estimator(...).fit())")
    run.add_argument("entry_point")
    run.add_argument("--source-dir")
    run.add_argument("--instance-type", default="local")
    run.add_argument("--instance-count", type=int, default=1)
    run.add_argument("--distribution", type=_json_arg, help="the distribution dict as JSON")
    run.add_argument("--hyperparameters", type=_json_arg, default={})
    run.add_argument("--input", action="append", default=[], metavar="CHANNEL=PATH")
    run.add_argument("--job-name")
    run.add_argument("--no-wait", action="store_true")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from meshtrain.estimator import Estimator

    inputs = dict(item.split("=", 1) for item in args.input) or None
    estimator = Estimator(entry_point=args.entry_point, source_dir=args.source_dir,
                          instance_type=args.instance_type, instance_count=args.instance_count,
                          distribution=args.distribution, hyperparameters=args.hyperparameters)
    job = estimator.fit(inputs=inputs, wait=not args.no_wait, job_name=args.job_name)
    print(f"job {job.job_name}: model data at {estimator.model_data}")
    return 0


def _add_job_commands(sub: argparse._SubParsersAction) -> None:
    for name, help_text in (("status", "print DescribeTrainingJob as JSON"),
                            ("logs", "print a job's logs"), ("stop", "stop a running job")):
        command = sub.add_parser(name, help=help_text)
        command.add_argument("job_name")
        command.set_defaults(handler=_job_command, action=name)


def _job_command(args: argparse.Namespace) -> int:
    from meshtrain.estimator import Estimator

    job = Estimator.attach(args.job_name).latest_training_job
    if args.action == "status":
        print(json.dumps(job.describe(), indent=2, default=str))
    elif args.action == "logs":
        job.logs()
    else:
        job.stop()
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshtrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    _add_job_commands(sub)
    register_plan(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        return args.handler(args)
    except ConfigError as error:
        print(f"meshtrain: {error}", file=sys.stderr)
        return 2
    except JobFailedError as error:
        print(f"meshtrain: {error}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
