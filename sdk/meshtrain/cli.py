"""The `meshtrain` command: run a script as a job, look at jobs, plan a layout."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from meshtrain.cli_args import channel_arg, json_object_arg
from meshtrain.cli_export import register_export
from meshtrain.cli_image import register_image
from meshtrain.cli_jobs import add_job_commands
from meshtrain.cli_slurm import register as register_slurm
from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.contract.hyperparameters import decode_hyperparameters
from meshtrain.job import was_reported
from meshtrain.pipes import drop_output_to_closed_pipes, send_closed_pipes_to_devnull
from meshtrain.plan.cli import register as register_plan

BROKEN_PIPE_EXIT = 128 + 13  # SIGPIPE's number, what a shell shows for `yes | head`


def _hyperparameter_arg(text: str) -> dict:
    """KEY=VALUE, the value read as the host reads a hyperparameter (JSON, else the text), or a
    JSON object of several."""
    if text.lstrip().startswith("{"):
        return json_object_arg(text)
    key, sep, value = text.partition("=")
    if not sep or not key:
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE (e.g. steps=3 lr=0.1) or a JSON object, got {text!r}; the entry "
            "point goes before --hyperparameters")
    return decode_hyperparameters({key: value})


def _merged_hyperparameters(given: list[dict]) -> dict:
    merged: dict = {}
    for part in given:
        for key, value in part.items():
            if key in merged and merged[key] != value:
                raise ConfigError(f"--hyperparameters gives {key!r} twice ({merged[key]!r} and "
                                  f"{value!r}); give it once.")
            merged[key] = value
    return merged


def _add_run(sub: argparse._SubParsersAction) -> None:
    run = sub.add_parser("run", help="run a training script as a job (Estimator(...).fit())")
    run.add_argument("entry_point")
    run.add_argument("--source-dir")
    run.add_argument("--instance-type", default="local")
    run.add_argument("--instance-count", type=int, default=1)
    run.add_argument("--distribution", type=json_object_arg, help="the distribution dict as JSON")
    run.add_argument("--hyperparameters", type=_hyperparameter_arg, nargs="+", action="extend",
                     default=[], metavar="KEY=VALUE",
                     help="the script's hyperparameters: KEY=VALUE ... (each VALUE read as JSON "
                          "where it parses, as the host does: steps=3 is the int 3, lr=0.1 a "
                          "float, name=llama the string) or one JSON object")
    run.add_argument("--input", action="append", default=[], metavar="CHANNEL=PATH",
                     type=channel_arg)
    run.add_argument("--job-name")
    run.add_argument("--jobs-dir", help="where local jobs live (default ~/.meshtrain/jobs)")
    run.add_argument("--no-wait", action="store_true",
                     help="return once the job has started; follow it with `meshtrain logs`")
    run.set_defaults(handler=_run)


def _run(args: argparse.Namespace) -> int:
    from meshtrain.estimator import Estimator

    channels = [channel for channel, _ in args.input]
    if len(set(channels)) != len(channels):
        raise ConfigError(f"--input names a channel twice ({', '.join(channels)}); give each "
                          "channel once.")
    options = {"jobs_dir": args.jobs_dir} if args.jobs_dir else {}
    estimator = Estimator(entry_point=args.entry_point, source_dir=args.source_dir,
                          instance_type=args.instance_type, instance_count=args.instance_count,
                          distribution=args.distribution,
                          hyperparameters=_merged_hyperparameters(args.hyperparameters), **options)
    job = estimator.fit(inputs=dict(args.input) or None, wait=not args.no_wait,
                        job_name=args.job_name)
    if args.no_wait:  # nothing has run yet: no model data to announce
        print(f"job {job.job_name} started; follow it with `meshtrain logs {job.job_name}`, "
              f"stop it with `meshtrain stop {job.job_name}`.")
    elif job.status == "Completed":
        print(f"job {job.job_name}: model data at {estimator.model_data}")
    return 0


def _add_k8s(sub: argparse._SubParsersAction) -> None:
    k8s = sub.add_parser("k8s", help="Kubernetes (Kubeflow) manifests")
    actions = k8s.add_subparsers(dest="k8s_command", required=True)
    render = actions.add_parser("render", help="print a ConfigMap + PyTorchJob/TrainJob manifest "
                                               "for `kubectl apply -f`")
    render.add_argument("entry_point")
    render.add_argument("--source-dir")
    render.add_argument("--instance-type", required=True, help="e.g. ml.p4d.24xlarge")
    render.add_argument("--instance-count", type=int, default=1)
    render.add_argument("--image", required=True, help="image with python3, torch and meshtrain")
    render.add_argument("--distribution", type=json_object_arg,
                        help="the distribution dict as JSON")
    render.add_argument("--hyperparameters", type=json_object_arg, default={})
    render.add_argument("--input", action="append", default=[], metavar="CHANNEL=pvc://CLAIM",
                        type=channel_arg)
    render.add_argument("--output-path", help="pvc://CLAIM[/PATH] for /opt/ml/model")
    render.add_argument("--job-name", required=True)
    render.add_argument("--namespace", default="default")
    render.add_argument("--kind", default="PyTorchJob", choices=("PyTorchJob", "TrainJob"))
    render.add_argument("--code-in-image", action="store_true",
                        help="the image already holds the code in /opt/ml/code")
    render.set_defaults(handler=_k8s_render)


def _k8s_render(args: argparse.Namespace) -> int:
    from meshtrain import kubernetes
    from meshtrain.estimator import Estimator

    estimator = Estimator(entry_point=args.entry_point, source_dir=args.source_dir,
                          instance_type=args.instance_type, instance_count=args.instance_count,
                          image_uri=args.image, distribution=args.distribution,
                          hyperparameters=args.hyperparameters, output_path=args.output_path,
                          preflight=False)
    objects = kubernetes.render_all(estimator, job_name=args.job_name, namespace=args.namespace,
                                    kind=args.kind, inputs=dict(args.input) or None,
                                    code_in_image=args.code_in_image)
    sys.stdout.write(kubernetes.to_yaml(objects))
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="meshtrain", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _add_run(sub)
    add_job_commands(sub)
    register_plan(sub)
    _add_k8s(sub)
    register_image(sub)
    register_export(sub)
    register_slurm(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run one command; the exit code: 0 ok, 1 the job failed, 2 a usage or configuration
    error (a one-line message, no traceback), 130 interrupted (Ctrl-C), 141 the reader of the
    output went away (as a tool killed by SIGPIPE; no traceback)."""
    try:
        args = build_parser().parse_args(argv)
    except SystemExit as exit_:  # argparse already printed usage and the error (code 2)
        return exit_.code if isinstance(exit_.code, int) else 2
    try:
        code = args.handler(args)
        sys.stdout.flush()  # a reader gone by now is met here, not in the flush at exit
        return code
    except ConfigError as error:
        print(f"meshtrain: {error}", file=sys.stderr)
        return 2
    except JobFailedError as error:
        print(f"meshtrain: {error}", file=sys.stderr)
        return 1
    except KeyboardInterrupt as interrupt:  # following a job: it said what it did, in a line
        if not was_reported(interrupt):
            with drop_output_to_closed_pipes():
                print("meshtrain: interrupted", file=sys.stderr, flush=True)
        return 130
    except BrokenPipeError:  # the reader went away (`meshtrain status JOB | head -1`)
        send_closed_pipes_to_devnull()
        return BROKEN_PIPE_EXIT


if __name__ == "__main__":
    sys.exit(main())
