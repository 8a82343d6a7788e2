"""Metric lines for SageMaker's MetricDefinitions: ``log_metric("train:loss", 0.25, step=10)``.

Prints ``[meshtrain metric] train:loss=0.25 step=10`` on global rank 0 (the other ranks hold the
same value in data-parallel training and would only repeat it). Start the job with
``metric_definitions=meshtrain.backends.sagemaker_metrics.metric_definitions("train:loss")``
and SageMaker records the value as the metric ``train:loss``. Elsewhere (local jobs, Kubernetes)
the line is just a log line. Importing this module does not import torch.
"""

from __future__ import annotations

import math
import os
import re
import sys

METRIC_LINE_PREFIX = "[meshtrain metric]"
_NAME = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")


def _is_rank_zero() -> bool:
    return os.environ.get("RANK", "0") == "0"


def format_metric_line(name: str, value: float, step: int | None = None) -> str:
    """The line `log_metric` prints (without the newline)."""
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"metric name {name!r} is invalid: use 1-200 letters, digits and "
                         "'_ . : / -', e.g. 'train:loss'.")
    number = float(value)
    if not math.isfinite(number):
        text = "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
    else:
        text = repr(number)
    line = f"{METRIC_LINE_PREFIX} {name}={text}"
    if step is not None:
        line += f" step={int(step)}"
    return line


def log_metric(name: str, value: float, step: int | None = None) -> None:
    """Print one metric line on global rank 0 (flushed, so the log shows it at once)."""
    line = format_metric_line(name, value, step)
    if _is_rank_zero():
        print(line, file=sys.stdout, flush=True)


def log_metrics(step: int | None = None, **values: float) -> None:
    """`log_metric` for each keyword, e.g. ``log_metrics(loss=0.25, lr=1e-4, step=10)``."""
    lines = [format_metric_line(name, value, step) for name, value in values.items()]
    if _is_rank_zero() and lines:
        print("\n".join(lines), file=sys.stdout, flush=True)
