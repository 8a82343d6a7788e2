"""MetricDefinitions for the metric lines `meshtrain_runtime.metrics.log_metric` prints.

A script calls ``log_metric("train:loss", 0.25, step=10)``, which prints the line

    [meshtrain metric] train:loss=0.25 step=10

and the job is started with ``metric_definitions=metric_definitions("train:loss")``: SageMaker
then applies ``\\[meshtrain metric\\] train:loss=(<number>)`` to the job's logs and records the
captured number as the metric (CloudWatch, the console, hyperparameter tuning).
"""

from __future__ import annotations

import re

from meshtrain.errors import ConfigError

METRIC_LINE_PREFIX = "[meshtrain metric]"
PREFIX_PATTERN = r"\[meshtrain metric\]"  # plain constructs: SageMaker does not run Python re
NAME_PATTERN = re.compile(r"^[A-Za-z0-9_.:/-]{1,200}$")
# A float as Python's repr() writes it (no inf/nan: SageMaker would not parse them anyway).
NUMBER_PATTERN = r"[-+]?(?:[0-9]+\.?[0-9]*|\.[0-9]+)(?:[eE][-+]?[0-9]+)?"


def metric_regex(name: str) -> str:
    """The regex SageMaker applies to the logs to read metric `name`'s value."""
    check_metric_name(name)
    return f"{PREFIX_PATTERN} {re.escape(name)}=({NUMBER_PATTERN})"


def check_metric_name(name: object) -> str:
    if not isinstance(name, str) or not NAME_PATTERN.match(name):
        raise ConfigError(
            f"metric name {name!r} is invalid: use 1-200 letters, digits and '_ . : / -' "
            "(e.g. 'train:loss'), so that its log line can be matched exactly."
        )
    return name


def metric_definitions(*names: str) -> list[dict[str, str]]:
    """SageMaker MetricDefinitions for metrics a script logs with meshtrain_runtime's log_metric.

    >>> metric_definitions("train:loss")[0]["Name"]
    'train:loss'
    """
    if len(set(names)) != len(names):
        raise ConfigError(f"metric names must be unique, got {list(names)}.")
    return [{"Name": check_metric_name(name), "Regex": metric_regex(name)} for name in names]
