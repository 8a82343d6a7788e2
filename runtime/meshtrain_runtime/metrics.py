"""Metric lines for logs, SageMaker's MetricDefinitions and meshtrain's progress display.

``log(step=10, loss=0.25, tokens=65536)`` prints, on global rank 0, the standard metrics on one
line::

    [meshtrain metric] train:loss=0.25 train:tokens_per_sec=31250.0 train:tflops=... \
        train:mfu=... train:cpu_rss_gib=... step=10

(one line in the log: tflops with a FLOP count, see configure(); mfu on a GPU the peak table
knows; train:cuda_memory_gib / train:cuda_peak_memory_gib when CUDA is in use), and any further
keyword as ``train:<name>``. ``log_metric(name, value, step)`` prints a one-value line of any
name, ``log_metrics(step, **values)`` one line of several. A loss is each rank's own:
``log(loss=global_mean(loss))`` logs the global batch's. The line format is
:mod:`meshtrain.contract.metrics`; SageMaker jobs get matching MetricDefinitions from the
Estimator. When the `tensorboard` package is installed (and the script
uses torch), rank 0 also writes every value as a TensorBoard scalar into
``/opt/ml/output/tensorboard`` (SageMaker's TensorBoardOutputConfig default). Importing this
module does not import torch.
"""

from __future__ import annotations

import os
import resource
import sys
import time
from typing import Any

from meshtrain.contract.metrics import format_metric_line, format_metrics_line
from meshtrain.contract.paths import OptMLPaths
from meshtrain_runtime.throughput import FlopCounter, peak_flops_per_device

GIB = 1024**3


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def _print_line(values: dict[str, float], step: int | None) -> None:
    """One metric line for all of `values` (a log stays readable at one line per step); the
    names are checked on every rank, so a bad one fails everywhere alike."""
    if values:
        _print(format_metrics_line(values, step))


def _print(line: str) -> None:
    """The line and its newline in one write, flushed: print() writes them apart, and a reader
    of the rank's output between the two (torchrun's tailer) would see half a line."""
    if _is_rank_zero():
        sys.stdout.write(line + "\n")
        sys.stdout.flush()


_tensorboard: Any = None  # None: not tried yet; False: not available


def _tensorboard_writer() -> Any:
    """Rank 0's SummaryWriter, made on first use; None without tensorboard (or torch)."""
    global _tensorboard
    if _tensorboard is None:
        _tensorboard = False
        paths = OptMLPaths.from_env()
        # Inside a job only (its output folder exists), and never importing torch for a script
        # that does not use it.
        if "torch" in sys.modules and paths.output_dir.is_dir():
            try:
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:  # the tensorboard package is optional
                return None
            _tensorboard = SummaryWriter(log_dir=str(paths.tensorboard_dir))
    return _tensorboard or None


def _write_scalars(values: dict[str, float], step: int | None) -> None:
    if not _is_rank_zero() or not values:
        return
    writer = _tensorboard_writer()
    if writer is not None:
        for name, value in values.items():
            writer.add_scalar(name, value, global_step=step)
        writer.flush()


def log_metric(name: str, value: float, step: int | None = None) -> None:
    """Print one metric line on global rank 0 (flushed, so the log shows it at once)."""
    _print(format_metric_line(name, value, step))
    _write_scalars({name: float(value)}, step)


def log_metrics(step: int | None = None, **values: float) -> None:
    """One line of every keyword, e.g. ``log_metrics(loss=0.25, lr=1e-4, step=10)`` prints
    ``[meshtrain metric] loss=0.25 lr=0.0001 step=10``."""
    _print_line(values, step)
    _write_scalars({name: float(value) for name, value in values.items()}, step)


def global_mean(value: Any) -> float:
    """The mean of a scalar (a tensor or a number) over every rank, as a float; call it on
    every rank (it is one all-reduce).

    Data-parallel ranks hold the losses of their own batches and tensor-parallel ranks hold
    copies of their group's, so with equal batches per rank this is the global batch's loss:
    ``meshtrain_runtime.metrics.log(step=step, loss=global_mean(loss))``. Without a process
    group (one process) it is the value itself.
    """
    import torch
    import torch.distributed as dist

    tensor = value.detach() if isinstance(value, torch.Tensor) else torch.tensor(float(value))
    if hasattr(tensor, "full_tensor"):  # a DTensor loss (loss_parallel)
        tensor = tensor.full_tensor()
    if not dist.is_initialized() or dist.get_world_size() == 1:
        return float(tensor)
    total = tensor.to(torch.float64).reshape(1).clone()
    if dist.get_backend() == "nccl":
        total = total.cuda()
    dist.all_reduce(total)
    return float(total) / dist.get_world_size()


class MetricsLogger:
    """Standard training metrics: loss, throughput (tokens/s, TFLOP/s, MFU) and memory.

    Throughput is measured between consecutive ``log()`` calls (the first call only starts the
    clock), or over ``seconds=`` when the script timed the interval itself.
    """

    def __init__(self, flops: FlopCounter | None = None, world_size: int | None = None,
                 peak_flops: float | None = None) -> None:
        self.flops = flops
        self.world_size = world_size or int(os.environ.get("WORLD_SIZE", "1"))
        self.peak_flops = peak_flops
        self._last: float | None = None

    def values(self, *, loss: float | None = None, tokens: int | None = None,
               seconds: float | None = None, **more: float) -> dict[str, float]:
        """The metrics one log() call reports, by full name (``train:...``)."""
        now = time.perf_counter()
        if seconds is None and self._last is not None:
            seconds = now - self._last
        self._last = now
        out: dict[str, float] = {}
        if loss is not None:
            out["train:loss"] = float(loss)
        if tokens is not None and seconds:
            out.update(self.throughput(tokens, seconds))
        out.update(memory_metrics())
        out.update({f"train:{name}": float(value) for name, value in more.items()})
        return out

    def throughput(self, tokens: int, seconds: float) -> dict[str, float]:
        """tokens/s of the job; with a FLOP count, TFLOP/s per device and MFU against its peak."""
        out = {"train:tokens_per_sec": tokens / seconds}
        if self.flops is None:
            return out
        flops_per_device = self.flops.per_token * tokens / seconds / self.world_size
        out["train:tflops"] = flops_per_device / 1e12
        peak = self.peak_flops if self.peak_flops is not None else peak_flops_per_device()
        if peak:
            out["train:mfu"] = flops_per_device / peak
        return out

    def log(self, step: int | None = None, **values: Any) -> dict[str, float]:
        """Print the metrics on global rank 0 (one line) and return them (every rank)."""
        metrics = self.values(**values)
        _print_line(metrics, step)
        _write_scalars(metrics, step)
        return metrics


def memory_metrics() -> dict[str, float]:
    """CUDA allocated and peak (when CUDA is in use) and this process's peak RSS, in GiB."""
    out: dict[str, float] = {}
    torch = sys.modules.get("torch")  # only when the script already uses it
    if torch is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        out["train:cuda_memory_gib"] = torch.cuda.memory_allocated() / GIB
        out["train:cuda_peak_memory_gib"] = torch.cuda.max_memory_allocated() / GIB
    peak_kib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # KiB on Linux
    out["train:cpu_rss_gib"] = peak_kib * 1024 / GIB
    return out


_default: MetricsLogger | None = None


def configure(model: Any = None, *, seq_len: int | None = None, num_params: int | None = None,
              num_layers: int | None = None, hidden_size: int | None = None,
              peak_tflops: float | None = None, world_size: int | None = None) -> MetricsLogger:
    """Set up ``log()``: with a model (or its sizes) and `seq_len`, TFLOP/s and MFU are reported.

    FLOPs per token are 6·N + 12·L·h·s (N parameters outside the input embeddings, L layers,
    hidden size h, sequence length s: the matmuls of forward and backward plus attention's
    scores and values, as PaLM's appendix B counts them). The peak is the device's dense bf16
    rate from meshtrain's table, or `peak_tflops`.
    """
    global _default
    flops = None
    if seq_len is not None and (model is not None or num_params is not None):
        flops = FlopCounter.build(model, seq_len=seq_len, num_params=num_params,
                                  num_layers=num_layers, hidden_size=hidden_size)
    peak = peak_tflops * 1e12 if peak_tflops is not None else None
    _default = MetricsLogger(flops, world_size=world_size, peak_flops=peak)
    return _default


def log(step: int | None = None, **values: Any) -> dict[str, float]:
    """Print the standard metrics (see the module docstring) with the default logger."""
    return (_default or configure()).log(step, **values)


def reset() -> None:
    """Forget the default logger (its clock and FLOP count) and close the TensorBoard writer."""
    global _default, _tensorboard
    _default = None
    if _tensorboard:
        _tensorboard.close()
    _tensorboard = None
