"""What the plan table's words mean: its columns, the phase table, and the speeds behind tokens/s.

The table is read by people who did not write the planner: every column it shows is explained
under it, a column left out for width is named, and the GPU the speed estimate assumes is said.
"""

from __future__ import annotations

from rich.table import Table
from rich.text import Text

from meshtrain.contract import accelerators
from meshtrain.contract.accelerators import GPUSpec
from meshtrain.plan.cluster import GIB, Cluster

COLUMN_MEANINGS = {
    "#": "rank: fitting layouts first, fastest first (then the closest to fitting)",
    "pp": "pipeline-parallel degree (stages' ranks); a pipeline layout's memory is its peak "
          "rank's, its tokens/s counts the bubble (pp N (schedule, microbatches, bubble))",
    "layout": "shard N = FSDP sharding group, rep M = its replicas (hybrid), tp/ep/cp = "
              "tensor/expert/context-parallel degree, +sp = sequence parallel; zero3 = "
              "full_shard, zero2 = shard_grad_op, ddp = no_shard; ckpt = activation "
              "checkpointing (+offload: to host memory), sac = selective (op-level) "
              "checkpointing",
    "peak GiB": "the most memory one {unit} holds at any phase of a step",
    "fits": "peak <= {usable} (the {unit}'s memory minus a reserve for CUDA, NCCL and "
            "fragmentation); ? where there is no GPU memory to judge by",
    "phase": "the phase of the step that peaks: forward, loss (logits and loss), backward, "
             "step (optimizer)",
    "tokens/s": "estimated tokens per second of the whole job (speeds below)",
    "states": "parameters + gradients + optimizer states per {unit}",
    "activations": "activations kept for backward, at the peak",
    "temp": "temporary buffers at the peak (gathered parameters, reduce-scatter buffers, loss "
            "temporaries)",
    "comm GB/step": "GB one {unit} sends per step (FSDP gathers and reduce-scatters, "
                    "data-parallel all-reduce, TP/EP/CP collectives)",
}
PHASE_LEGEND = ("Phases: forward; loss (the logits and the loss, the usual peak); backward; "
                "step (the optimizer). * marks the peak phase, whose total is the table's peak.")
GENERIC_GPU = accelerators.A100_80
"""What `--gpus N` plans with (meshtrain.plan.cluster's nominal speeds are this GPU's)."""
_KNOWN_GPUS = tuple(value for value in vars(accelerators).values() if isinstance(value, GPUSpec))


def cluster_text(cluster: Cluster) -> str:
    """'8 x 80 GiB GPUs (1 host of 8, world size 8)' for --gpus; '2 x ml.p4d.24xlarge (8 ranks
    per host, world size 16)' for an instance type: the count always counts what follows it."""
    if cluster.instance_type is not None:
        return cluster.description
    hosts = f"{cluster.num_nodes} host{'s' if cluster.num_nodes > 1 else ''}"
    return (f"{cluster.world_size} x {cluster.gpu_memory_bytes / GIB:.0f} GiB GPUs ({hosts} of "
            f"{cluster.ranks_per_node}, world size {cluster.world_size})")


def assumed_gpu(cluster: Cluster) -> GPUSpec | None:
    """The GPU whose nominal speeds the cluster carries (memory breaks ties: A100 40/80 GB)."""
    same_speed = [gpu for gpu in _KNOWN_GPUS
                  if gpu.peak_tflops * 1e12 == cluster.peak_flops
                  and gpu.link_gbytes_per_s * 1e9 == cluster.intra_node_bytes_per_s]
    if not same_speed:
        return None
    return min(same_speed, key=lambda gpu: abs(gpu.memory_gib * GIB - cluster.gpu_memory_bytes))


def speed_text(cluster: Cluster, compute_efficiency: float) -> str:
    """Which GPU and which figures the tokens/s column assumes."""
    if cluster.peak_flops <= 0:
        return ("tokens/s for CPU ranks counts communication time only (the planner knows no "
                "CPU's compute speed): compare layouts by it, not the figure itself.")
    gpu = assumed_gpu(cluster)
    name = f"{gpu.name} speeds" if gpu else "the speeds"
    text = (f"tokens/s assumes {name}: {cluster.peak_flops / 1e12:g} TFLOP/s dense half-precision "
            f"peak at {compute_efficiency:.0%} of it (--compute-efficiency), "
            f"{cluster.intra_node_bytes_per_s / 1e9:g} GB/s between the GPUs of a host, "
            f"{cluster.inter_node_bytes_per_s * 8 / 1e9:g} Gbit/s between hosts; nominal "
            "figures that rank layouts, not a promised speed.")
    if cluster.instance_type is None:
        text += (f" --gpus names no GPU model: it plans with {GENERIC_GPU.name} speeds; "
                 "--instance-type plans with that instance's GPUs (ml.p5.48xlarge: H100s).")
    return text


def column_legend(shown: list[str], left_out: list[str], *, unit: str,
                  usable_gib: float | None) -> Table:
    """A two-column grid, 'name:' and its meaning (wrapped under itself), for every column
    shown, and a last row naming the columns left out for width."""
    usable = "usable memory" if usable_gib is None else f"{usable_gib:.1f} GiB usable"
    grid = Table.grid(padding=(0, 1))
    grid.add_column(no_wrap=True)
    grid.add_column()
    for name in shown:
        grid.add_row(Text(f"  {name}:"), Text(COLUMN_MEANINGS[name].format(unit=unit,
                                                                        usable=usable)))
    if left_out:
        grid.add_row(Text("  left out:"), Text(f"{', '.join(left_out)}, for width (a wider "
                                               "terminal or COLUMNS=140 shows them; --json has "
                                               "every figure)"))
    return grid


__all__ = ["COLUMN_MEANINGS", "PHASE_LEGEND", "assumed_gpu", "cluster_text", "column_legend",
           "speed_text"]
