"""The metric line: what a training script prints and what the client and SageMaker read back.

A rank prints one line per call, ``[meshtrain metric] train:loss=0.25 train:tokens_per_sec=31250.0
step=10`` (or a one-value ``[meshtrain metric] train:loss=0.25 step=10``). SageMaker reads each
value with the MetricDefinitions regex built here; meshtrain's own client (progress display,
``meshtrain plot``) parses the same line with :func:`parse_metric_records`. One format, one
module, both sides.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import NamedTuple

from meshtrain.contract.errors import ConfigError

METRIC_LINE_PREFIX = "[meshtrain metric]"
PREFIX_PATTERN = r"\[meshtrain metric\]"  # plain constructs: SageMaker does not run Python re
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
# A float as Python's repr() writes it (no inf/nan: SageMaker would not parse them anyway).
NUMBER_PATTERN = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"
_NAME = r"[A-Za-z0-9_.:/-]{1,200}"
_VALUE = rf"(?:{NUMBER_PATTERN}|nan|-?inf)"
# Records, then an optional integer step. The records are matched lazily so that a trailing
# ``step=10`` is the step, not a record; a value is always a float's repr ("10.0", "1e+16", "inf"),
# so a metric named "step" stays a record.
_LINE = re.compile(
    rf"{PREFIX_PATTERN}(?P<records>(?: {_NAME}={_VALUE})+?)"
    rf"(?: step=(?P<step>-?[0-9]+))?\s*$"
)
_RECORDS = re.compile(rf" ({_NAME})=({_VALUE})")

# The metrics meshtrain_runtime.metrics.log() prints; the Estimator defines them on SageMaker.
STANDARD_METRICS = (
    "train:loss", "train:tokens_per_sec", "train:tflops", "train:mfu",
    "train:cuda_memory_gib", "train:cuda_peak_memory_gib", "train:cpu_rss_gib",
)


class MetricRecord(NamedTuple):
    """One value of a metric line, with the line's step."""

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


def _value_text(value: float) -> str:
    number = float(value)
    if math.isfinite(number):
        return repr(number)
    return "nan" if math.isnan(number) else ("inf" if number > 0 else "-inf")


def format_metrics_line(values: Mapping[str, float], step: int | None = None) -> str:
    """One line for several values (without the newline), in `values`' order, e.g.
    ``[meshtrain metric] train:loss=0.25 train:mfu=0.41 step=10``; inf/nan are written but never
    matched by the regexes."""
    if not values:
        raise ConfigError("a metric line needs at least one value, got none.")
    line = METRIC_LINE_PREFIX + "".join(
        f" {check_metric_name(name)}={_value_text(value)}" for name, value in values.items())
    if step is not None:
        line += f" step={int(step)}"
    return line


def format_metric_line(name: str, value: float, step: int | None = None) -> str:
    """The line for one value (without the newline): ``[meshtrain metric] name=value step=N``."""
    return format_metrics_line({name: value}, step)


def parse_metric_records(line: str) -> list[MetricRecord]:
    """Every value a log line carries (anywhere after a log prefix such as ``[algo-1 rank 0]``),
    in the line's order; [] for any other line."""
    start = line.find(METRIC_LINE_PREFIX)
    if start < 0:
        return []
    match = _LINE.match(line[start:].rstrip("\r\n"))
    if match is None:
        return []
    step = int(match.group("step")) if match.group("step") is not None else None
    return [MetricRecord(name, float(value), step)
            for name, value in _RECORDS.findall(match.group("records"))]


def parse_metric_line(line: str) -> MetricRecord | None:
    """The first value a log line carries (a one-value line's only one); None if none."""
    records = parse_metric_records(line)
    return records[0] if records else None


def metric_regex(name: str) -> str:
    """The regex SageMaker applies to the logs to read metric `name`'s value.

    It finds `name` anywhere in a metric line, one-value or several, and only as a whole name:
    the space before it and the ``=`` after it keep ``eval/train:loss`` and ``train:loss_scale``
    from matching ``train:loss``. Plain constructs only (SageMaker does not run Python's re).
    """
    check_metric_name(name)
    return f"{PREFIX_PATTERN}.* {re.escape(name)}=({NUMBER_PATTERN})"


def metric_definitions(*names: str) -> list[dict[str, str]]:
    """SageMaker MetricDefinitions for metrics a script logs with meshtrain_runtime's metrics.

    >>> metric_definitions("train:loss")[0]["Name"]
    'train:loss'
    """
    if len(set(names)) != len(names):
        raise ConfigError(f"metric names must be unique, got {list(names)}.")
    return [{"Name": check_metric_name(name), "Regex": metric_regex(name)} for name in names]
