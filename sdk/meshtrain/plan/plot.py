"""`meshtrain plan --plot FILE`: one layout's memory per phase as a stacked bar chart.

matplotlib is an optional extra (``pip install 'meshtrain[plot]'``), imported only when a plot
is asked for, so the planner and the CLI work without it.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.plan.cluster import GIB
from meshtrain.plan.layouts import LayoutEstimate


def _pyplot() -> Any:
    try:
        import matplotlib
    except ImportError:
        raise ConfigError("--plot needs matplotlib, which is not installed: pip install "
                          "'meshtrain[plot]' (or drop --plot).") from None
    matplotlib.use("Agg")  # files only: never opens a window, works without a display
    import matplotlib.pyplot as plt

    return plt


def plot_phases(estimate: LayoutEstimate, path: str | Path, *, title: str = "",
                capacity_bytes: int | None = None, unit: str = "GPU") -> Path:
    """Write a stacked bar chart (one bar per phase, one colour per term, GiB) to `path`;
    the format follows the suffix (.png, .svg, .pdf). A dashed line marks the capacity."""
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg", ".pdf"):
        raise ConfigError(f"--plot {str(path)!r}: use a .png, .svg or .pdf file name.")
    plt = _pyplot()
    phases = estimate.memory.phases
    terms = list(dict.fromkeys(term for phase in phases for term in phase.terms))
    names = [phase.name.replace("_", " ") for phase in phases]
    figure, axes = plt.subplots(figsize=(8, 5))
    bottom = [0.0] * len(phases)
    for term in terms:
        values = [phase.terms.get(term, 0.0) / GIB for phase in phases]
        if not any(values):
            continue
        axes.bar(names, values, bottom=bottom, label=term.replace("_", " "))
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    if capacity_bytes is not None:
        axes.axhline(capacity_bytes / GIB, color="black", linestyle="--", label="usable memory")
    axes.set_ylabel(f"GiB per {unit}")
    axes.set_title(title or "memory by phase")
    axes.legend(fontsize="small", loc="upper left", bbox_to_anchor=(1.0, 1.0))
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
    return path


__all__ = ["plot_phases"]
