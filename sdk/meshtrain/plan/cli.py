"""`meshtrain plan`: will a model fit, and which layout is fastest; with --goodput, what failures
cost a job of this size (full restarts against replica groups, goodput_cli.py).

Examples::

    meshtrain plan --num-params 7e9 --gpus 8 --json
    meshtrain plan --model llama2-70b --instance-type ml.p4d.24xlarge --instance-count 4
    meshtrain plan --goodput --gpus 16384 --replica-groups 16

Exit status: 0 once the plan is printed, whether or not a layout fits (the plan says so);
with --strict, 1 when no layout fits; 2 for a bad argument (printed on stderr).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
from collections.abc import Callable, Sequence

from pydantic import ValidationError
from rich.console import Console

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.cluster import Cluster, build_cluster
from meshtrain.plan.context import CP_COMM_TYPES
from meshtrain.plan.goodput_cli import add_goodput_arguments, run_goodput
from meshtrain.plan.layouts import PipelineOptions, Plan, plan_layouts, smallest_fitting_count
from meshtrain.plan.memory import OPTIMIZER_STATE_BYTES, Training
from meshtrain.plan.models import PRESETS, ModelSpec, llama_shaped, resolve_model
from meshtrain.plan.pipeline import PLANNED_SCHEDULES
from meshtrain.plan.plot import plot_phases  # imports matplotlib only when plotting
from meshtrain.plan.report import plan_to_dict, render_plan, short_layout

_DIMENSIONS = ("hidden_size", "num_layers", "num_heads", "intermediate_size")
PIPED_WIDTH = 140
"""Columns of piped output (a file, `| less`, `| grep`): wide enough for every table column."""
_FINITE_EXAMPLES = {"num_params": "7e9", "largest_layer_params": "2.1e8", "gpu_memory": "80",
                    "reserve_gib": "5", "dropout": "0.1", "compute_efficiency": "0.4"}


def register(subparsers: argparse._SubParsersAction) -> argparse.ArgumentParser:
    """Add the `plan` subcommand to an argparse subparsers object; its handler is `run_plan`."""
    parser = subparsers.add_parser(
        "plan", help="estimate memory (by phase) and communication per rank and rank layouts",
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    parser.set_defaults(handler=run_plan)
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The plan options, on any parser."""
    model = parser.add_argument_group("model (one of --model, --num-params, or dimensions)")
    model.add_argument("--model", help=f"a preset ({', '.join(PRESETS)}) or a config.json path")
    model.add_argument("--num-params", type=float, help="only the parameter count, e.g. 7e9")
    for name in (*_DIMENSIONS, "num_kv_heads", "vocab_size", "num_experts", "experts_per_token"):
        model.add_argument(f"--{name.replace('_', '-')}", type=int)
    encdec = parser.add_argument_group(
        "encoder-decoder dimensions (T5 or BART style; with --num-decoder-layers, --num-layers "
        "counts the encoder's blocks)")
    encdec.add_argument("--num-decoder-layers", type=int)
    encdec.add_argument("--family", choices=("t5", "bart"), default="t5",
                        help="t5 (RMS norms, relative position bias, no biases) or bart "
                             "(LayerNorms, learned positions, biases)")
    encdec.add_argument("--head-dim", type=int, help="T5's d_kv (default hidden / heads)")
    encdec.add_argument("--ffn", choices=("relu", "gated_gelu", "gelu"),
                        help="the MLP: relu (T5's default) or gated_gelu (T5 v1.1, Flan-T5); "
                             "gelu (BART's default) or relu")
    encdec.add_argument("--tie-embeddings", action=argparse.BooleanOptionalAction,
                        help="T5: the output head is the shared embedding (T5 v1.0 yes, "
                             "v1.1 no; default no); BART always ties it")
    encdec.add_argument("--max-position-embeddings", type=int,
                        help="BART's learned positions per stack (default 1024, as its configs)")
    encdec.add_argument("--dropout", type=float, default=0.0,
                        help="every dropout rate (T5's and BART's configs: 0.1)")
    model.add_argument("--largest-layer-params", type=float,
                       help="parameters of the largest block, e.g. 2.1e8 (sizes FSDP's "
                            "gathered buffers; default: from the shape)")
    run = parser.add_argument_group("training")
    run.add_argument("--seq-len", type=int, default=4096,
                     help="tokens per sequence (an encoder-decoder's encoder input)")
    run.add_argument("--decoder-seq-len", type=int,
                     help="encoder-decoder models: the decoder's (labels') tokens "
                          "(default --seq-len)")
    run.add_argument("--micro-batch", type=int, default=1, help="sequences per data-parallel rank")
    run.add_argument("--precision", choices=("bf16", "fp16", "fp32"), default="bf16")
    run.add_argument("--optimizer", choices=tuple(OPTIMIZER_STATE_BYTES), default="adamw")
    run.add_argument("--fused-optimizer", action="store_true",
                     help="torch's fused Adam: no step buffer")
    run.add_argument("--optimizer-offload", action="store_true",
                     help="optimizer states and step in host memory (a script's own offloaded "
                          "optimizer; FSDP's cpu_offload also moves parameters and gradients)")
    run.add_argument("--reshard-after-forward", choices=("auto", "true", "false"),
                     default="auto",
                     help="FSDP groups free their gathered parameters after forward (true) or "
                          "keep them until backward (false) in every candidate; auto (default): "
                          "each strategy's choice, and no_shard both ways")
    run.add_argument("--microbatches", type=int,
                     help="pipeline layouts: microbatches per step, dividing --micro-batch "
                          "(default --micro-batch: one row each); 1F1B needs at least pp")
    run.add_argument("--pipeline-schedule", choices=PLANNED_SCHEDULES, default="1F1B",
                     help="pipeline layouts' schedule (default 1F1B); the interleaved and ZBV "
                          "ones run 2 stages per rank")
    run.add_argument("--cp-comm-type", choices=CP_COMM_TYPES, default="p2p",
                     help="context-parallel layouts' attention exchange: p2p (a ring of "
                          "key/value sends, default), all_gather or a2a (Ulysses all-to-all of "
                          "heads); --seq-len must divide into 2 x cp chunks")
    run.add_argument("--convention", choices=("zero", "smp"), default="zero",
                     help="bytes per parameter: zero=16 (default), smp=20 (with Adam)")
    run.add_argument("--compute-efficiency", type=float, default=0.4,
                     help="fraction of peak FLOP/s reached, for ranking (default 0.4)")
    cluster = parser.add_argument_group("cluster (an instance type, or --gpus)")
    cluster.add_argument("--instance-type", help="e.g. ml.p4d.24xlarge")
    cluster.add_argument("--instance-count", type=int, default=1)
    cluster.add_argument("--processes-per-host", type=int)
    cluster.add_argument("--gpus", type=int, help="total GPUs")
    cluster.add_argument("--gpu-memory", type=float, help="GiB per GPU (default 80 with --gpus)")
    cluster.add_argument("--gpus-per-node", type=int, help="with --gpus (default min(gpus, 8))")
    cluster.add_argument("--reserve-gib", type=float,
                         help="per GPU, for CUDA context, NCCL, fragmentation "
                              "(default 1 + 5%% of GPU memory)")
    out = parser.add_argument_group("output")
    out.add_argument("--top", type=int, default=10, help="candidates to show (0: all)")
    out.add_argument("--json", action="store_true", help="machine-readable output")
    out.add_argument("--plot", metavar="FILE",
                     help="write the recommended layout's memory by phase as a stacked bar "
                          "chart (.png/.svg/.pdf; needs the 'plot' extra: matplotlib)")
    out.add_argument("--strict", action="store_true",
                     help="exit with status 1 when no layout fits (default: 0 once the plan is "
                          "printed; the plan itself says whether anything fits)")
    add_goodput_arguments(parser)


def model_from_args(args: argparse.Namespace) -> ModelSpec:
    """--model, --num-params or explicit dimensions (exactly one of them) -> ModelSpec, with
    --largest-layer-params when given."""
    model = _model_shape(args)
    largest = getattr(args, "largest_layer_params", None)
    if largest is None:
        return model
    if largest < 1:
        raise ConfigError(f"--largest-layer-params {largest:g} must be at least 1.")
    return model.model_copy(update={"largest_layer_params": int(largest)})


def _model_shape(args: argparse.Namespace) -> ModelSpec:
    given = [args.model is not None, args.num_params is not None,
             any(getattr(args, name) is not None for name in _DIMENSIONS)]
    if sum(given) != 1:
        raise ConfigError("Name the model one way: --model NAME|config.json, --num-params N, "
                          "or --hidden-size/--num-layers/--num-heads/--intermediate-size.")
    if args.model is not None:
        return resolve_model(args.model)
    if args.num_params is not None:
        return llama_shaped(args.num_params, vocab_size=args.vocab_size or 32000)
    missing = [f"--{name.replace('_', '-')}" for name in _DIMENSIONS if getattr(args, name) is None]
    if missing:
        raise ConfigError(f"Explicit dimensions need {', '.join(missing)} as well.")
    if getattr(args, "num_decoder_layers", None):
        return _encoder_decoder_shape(args)
    experts = args.num_experts or 0
    return ModelSpec(
        name="custom", family="mixtral" if experts else "llama", hidden_size=args.hidden_size,
        num_layers=args.num_layers, num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads or args.num_heads,
        intermediate_size=args.intermediate_size, vocab_size=args.vocab_size or 32000,
        num_experts=experts, experts_per_token=args.experts_per_token or (2 if experts else 0))


def _encoder_decoder_shape(args: argparse.Namespace) -> ModelSpec:
    bart = args.family == "bart"
    tie = args.tie_embeddings if args.tie_embeddings is not None else bart
    positions = {"max_position_embeddings": args.max_position_embeddings or 1024} if bart else {}
    try:
        return ModelSpec(
            name=f"custom encoder-decoder ({args.family})", family=args.family,
            hidden_size=args.hidden_size, num_layers=args.num_layers,
            num_decoder_layers=args.num_decoder_layers, num_attention_heads=args.num_heads,
            num_key_value_heads=args.num_heads, head_dim=args.head_dim,
            intermediate_size=args.intermediate_size,
            vocab_size=args.vocab_size or (50265 if bart else 32128),
            ffn=args.ffn or ("gelu" if bart else "relu"), tie_word_embeddings=tie,
            qkv_bias=bart, o_bias=bart, mlp_bias=bart, hidden_dropout=args.dropout,
            attention_dropout=args.dropout, activation_dropout=args.dropout if bart else 0.0,
            **positions)
    except ValidationError as error:
        raise ConfigError(f"Encoder-decoder dimensions: {error.errors()[0]['msg']}") from None


def cluster_from_args(args: argparse.Namespace) -> tuple[Cluster, Callable[[int], Cluster]]:
    """The cluster asked for, and count -> the same kind with `count` hosts."""
    if args.instance_type is not None and args.gpus is not None:
        raise ConfigError("Give either --instance-type (with --instance-count) or --gpus.")
    if args.instance_type is not None:
        def build(count: int) -> Cluster:
            return build_cluster(instance_type=args.instance_type, instance_count=count,
                                 processes_per_host=args.processes_per_host,
                                 gpu_memory_gib=args.gpu_memory, reserve_gib=args.reserve_gib)

        return build(args.instance_count), build
    base = build_cluster(gpus=args.gpus, gpu_memory_gib=args.gpu_memory,
                         gpus_per_node=args.gpus_per_node, reserve_gib=args.reserve_gib)

    def build_nodes(count: int) -> Cluster:
        return build_cluster(gpus=count * base.ranks_per_node, gpu_memory_gib=args.gpu_memory,
                             gpus_per_node=base.ranks_per_node, reserve_gib=args.reserve_gib)

    return base, build_nodes


def check_finite(args: argparse.Namespace) -> None:
    """Every number given must be finite: `float('nan')` and `inf` parse, but plan nothing."""
    for name, value in sorted(vars(args).items()):
        if isinstance(value, float) and not math.isfinite(value):
            flag = f"--{name.replace('_', '-')}"
            raise ConfigError(f"{flag} {value} is not a finite number: give a value such as "
                              f"{_FINITE_EXAMPLES.get(name, '1.0')}.")


def build_plan(args: argparse.Namespace) -> tuple[Plan, Callable[[int], Cluster]]:
    """The ranked plan for parsed arguments, and how to build a bigger cluster."""
    check_finite(args)
    model = model_from_args(args)
    training = Training(seq_len=args.seq_len, micro_batch=args.micro_batch,
                        precision=args.precision, optimizer=args.optimizer,
                        convention=args.convention, compute_efficiency=args.compute_efficiency,
                        fused_optimizer=args.fused_optimizer,
                        optimizer_offload=args.optimizer_offload,
                        decoder_seq_len=getattr(args, "decoder_seq_len", None))
    cluster, build = cluster_from_args(args)
    return plan_layouts(model, cluster, training, reshard_from_args(args),
                        pipeline_from_args(args), getattr(args, "cp_comm_type", "p2p")), build


def pipeline_from_args(args: argparse.Namespace) -> PipelineOptions:
    """--microbatches and --pipeline-schedule (see `meshtrain.plan.layouts.PipelineOptions`)."""
    microbatches = getattr(args, "microbatches", None)
    if microbatches is not None and microbatches < 1:
        raise ConfigError(f"--microbatches {microbatches} must be at least 1.")
    return PipelineOptions(microbatches, getattr(args, "pipeline_schedule", "1F1B"))


def reshard_from_args(args: argparse.Namespace) -> bool | None:
    """--reshard-after-forward: None for auto (see `meshtrain.plan.layouts.Reshard`)."""
    return {"auto": None, "true": True, "false": False}[
        getattr(args, "reshard_after_forward", "auto")]


def run_plan(args: argparse.Namespace) -> int:
    """Handler of `meshtrain plan`: print the plan; exit 0, or 1 with --strict if nothing fits."""
    if getattr(args, "goodput", False):
        check_finite(args)
        if args.gpus is None and args.instance_type is None:
            raise ConfigError("--goodput needs the job's size: --gpus N, or --instance-type "
                              "with --instance-count.")
        return run_goodput(args, cluster_from_args(args)[0].world_size)
    plan, build = build_plan(args)
    top = None if args.top == 0 else args.top
    best = plan.best
    if args.plot is not None:
        _plot(plan, args.plot)
    bigger = None
    if best is None:  # nothing fits: how many hosts of this kind would do
        bigger = smallest_fitting_count(plan.model, plan.training, build,
                                        above=plan.cluster.num_nodes,
                                        reshard=reshard_from_args(args),
                                        pipeline=pipeline_from_args(args),
                                        cp_comm_type=plan.cp_comm_type)
    if args.json:
        data = plan_to_dict(plan, top=top,
                            smallest_fitting_node_count=None if bigger is None else bigger[0])
        print(json.dumps(data, indent=2))
    else:
        console = _console()
        render_plan(plan, console, top=top or len(plan.candidates))
        if bigger is not None:
            count, bigger_plan = bigger
            console.print(f"With {count} nodes of this kind, {short_layout(bigger_plan.best)} "
                          f"fits: {bigger_plan.best.describe()}.")  # type: ignore[union-attr]
    return 1 if best is None and args.strict else 0


def _console() -> Console:
    """The terminal's width on a terminal (COLUMNS where set); piped output is not cut to 80
    columns but gets every column of the table (PIPED_WIDTH)."""
    console = Console()
    if console.is_terminal or "COLUMNS" in os.environ:
        return console
    return Console(width=PIPED_WIDTH)


def _plot(plan: Plan, path: str) -> None:
    shown = plan.best or (plan.candidates[0] if plan.candidates else None)
    if shown is None:
        raise ConfigError("--plot: no candidate layout to plot for this cluster.")
    plot_phases(shown, path, title=f"{plan.model.name}: {short_layout(shown)}",
                capacity_bytes=plan.cluster.capacity_bytes, unit=plan.cluster.rank_unit)
    print(f"memory by phase written to {path}", file=sys.stderr)


def plan_main(argv: Sequence[str] | None = None) -> int:
    """`meshtrain plan` on its own: parse `argv`, run, map a ConfigError to exit status 2."""
    parser = argparse.ArgumentParser(prog="meshtrain plan", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    add_arguments(parser)
    args = parser.parse_args(argv)
    try:
        return run_plan(args)
    except ConfigError as error:
        print(f"meshtrain plan: {error}", file=sys.stderr)
        return 2


__all__ = ["add_arguments", "build_plan", "cluster_from_args", "model_from_args", "plan_main",
           "register", "run_plan"]
