"""The metric line: what a training script prints and what the client and SageMaker read back.

A rank prints ``[meshtrain metric] train:loss=0.25 step=10``. SageMaker reads the value with the
MetricDefinitions regex built here; meshtrain's own client (progress display, ``meshtrain plot``)
parses the same line with :func:`parse_metric_line`. One format, one module, both sides.
"""

from __future__ import annotations

import math
import re
from typing import NamedTuple

from meshtrain.contract.errors import ConfigError

METRIC_LINE_PREFIX = "[meshtrain metric]"
PREFIX_PATTERN = r"\[meshtrain metric\]"  # plain constructs: SageMaker does not run Python re
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
# A float as Python's repr() writes it (no inf/nan: SageMaker would not parse them anyway).
NUMBER_PATTERN = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_LINE = re.compile(
    rf"{PREFIX_PATTERN} (?P<name>[A-Za-z0-9_.:/-]{{1,200}})="
    rf"(?P<value>{NUMBER_PATTERN}|nan|-?inf)(?: step=(?P<step>-?[0-9]+))?\s*$"
)

# The metrics meshtrain_runtime.metrics.log() prints; the Estimator defines them on SageMaker.
STANDARD_METRICS = (
    "train:loss", "train:tokens_per_sec", "train:tflops", "train:mfu",
    "train:cuda_memory_gib", "train:cuda_peak_memory_gib", "train:cpu_rss_gib",
)


class MetricRecord(NamedTuple):
    """One parsed metric line."""

    name: str
    value: float
    step: int | None


def check_metric_name(name: object) -> str:
    """Return `name` if a metric line can carry it; else ConfigError with the allowed form."""
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(
            f"metric name {name!r} is invalid: use 1-200 letters, digits and '_ . : / -' "
            "(e.g. 'train:loss'), so that its log line can be matched exactly."
        )
    return name


def format_metric_line(name: str, value: float, step: int | None = None) -> str:
    """The line for one value (without the newline); inf/nan are written but never matched."""
    check_metric_name(name)
    number = float(value)
    if not math.isfinite(number):
        text = "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")
    else:
        text = repr(number)
    line = f"{METRIC_LINE_PREFIX} {name}={text}"
    if step is not None:
        line += f" step={int(step)}"
    return line


def parse_metric_line(line: str) -> MetricRecord | None:
    """The metric a log line carries (anywhere after a log prefix such as ``[algo-1 rank 0]``)."""
    start = line.find(METRIC_LINE_PREFIX)
    if start < 0:
        return None
    match = _LINE.match(line[start:].rstrip("\r\n"))
    if match is None:
        return None
    step = match.group("step")
    return MetricRecord(match.group("name"), float(match.group("value")),
                        int(step) if step is not None else None)


def metric_regex(name: str) -> str:
    """The regex SageMaker applies to the logs to read metric `name`'s value."""
    check_metric_name(name)
    return f"{PREFIX_PATTERN} {re.escape(name)}=({NUMBER_PATTERN})"


def metric_definitions(*names: str) -> list[dict[str, str]]:
    """SageMaker MetricDefinitions for metrics a script logs with meshtrain_runtime's metrics.

    >>> metric_definitions("train:loss")[0]["Name"]
    'train:loss'
    """
    if len(set(names)) != len(names):
        raise ConfigError(f"metric names must be unique, got {list(names)}.")
    return [{"Name": check_metric_name(name), "Regex": metric_regex(name)} for name in names]
