"""Loss and throughput curves of a job, read back from the metric lines in its log.

``meshtrain plot JOB -o loss.png`` (or :func:`plot_metrics`) draws one panel per metric against the
training step. matplotlib is imported only here (``pip install 'meshtrain[plot]'``).
"""

from __future__ import annotations

from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.metrics import parse_metric_records

DEFAULT_METRICS = ("train:loss", "train:tokens_per_sec")
_AXIS_LABELS = {"train:loss": "loss", "train:tokens_per_sec": "tokens/s", "train:tflops":
                "TFLOP/s per device", "train:mfu": "MFU"}


def read_metric_series(lines: Iterable[str]) -> dict[str, list[tuple[int, float]]]:
    """{metric name: [(step, value), ...]} in log order; lines without a step are numbered."""
    series: dict[str, list[tuple[int, float]]] = {}
    for line in lines:
        for record in parse_metric_records(line):  # a line may carry several metrics
            points = series.setdefault(record.name, [])
            points.append((record.step if record.step is not None else len(points),
                           record.value))
    return series


def axis_label(name: str) -> str:
    return _AXIS_LABELS.get(name, name.split(":", 1)[-1])


def plot_metrics(series: dict[str, list[tuple[int, float]]], output: str | Path, *,
                 names: Iterable[str] = DEFAULT_METRICS, title: str = "") -> Any:
    """Write a PNG with one panel per metric in `names` that the series hold; return the figure.

    The PNG's text chunks carry the title and each panel's axis labels, so a reader (or a test)
    can tell what was drawn without looking.
    """
    present = [name for name in names if series.get(name)]
    if not present:
        wanted, found = ", ".join(names), ", ".join(sorted(series)) or "none"
        raise ConfigError(f"no metric lines for {wanted} in the log (found: {found}). Log them "
                          "with meshtrain_runtime.metrics.log(step=..., loss=..., tokens=...).")
    figure = _figure_class()(figsize=(7, 2.6 * len(present)))
    axes = figure.subplots(len(present), 1, sharex=True, squeeze=False)
    for ax, name in zip(axes[:, 0], present, strict=True):
        steps, values = zip(*series[name], strict=True)
        ax.plot(steps, values, marker="o", markersize=3)
        ax.set_ylabel(axis_label(name))
        ax.grid(alpha=0.3)
    axes[-1, 0].set_xlabel("step")
    if title:
        figure.suptitle(title)
    figure.tight_layout()
    labels = "; ".join(f"{axis_label(n)} vs step" for n in present)
    figure.savefig(output, dpi=100, metadata={"Title": title or "meshtrain metrics",
                                              "Description": labels})
    return figure


def _figure_class() -> Any:
    # matplotlib's Figure, not pyplot: no global backend or figure state changes in the caller
    try:
        from matplotlib.figure import Figure
    except ImportError:
        raise ConfigError("plotting needs matplotlib: pip install 'meshtrain[plot]'.") from None
    return Figure
