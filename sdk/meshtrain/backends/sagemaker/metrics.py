"""MetricDefinitions for the metric lines `meshtrain_runtime.metrics` prints.

A script calls ``log_metric("train:loss", 0.25, step=10)``, which prints the line

    [meshtrain metric] train:loss=0.25 step=10

and the job is started with ``metric_definitions=metric_definitions("train:loss")``: SageMaker
then applies ``\\[meshtrain metric\\].* train:loss=(<number>)`` to the job's logs (it finds the
name anywhere in a one-value or several-value metric line) and records the captured number as
the metric (CloudWatch, the console, hyperparameter tuning). The line format lives in
:mod:`meshtrain.contract.metrics`; this module keeps the names users import.
"""

from __future__ import annotations

from meshtrain.contract.metrics import (
    METRIC_LINE_PREFIX,
    NAME_PATTERN,
    NUMBER_PATTERN,
    PREFIX_PATTERN,
    STANDARD_METRICS,
    check_metric_name,
    metric_definitions,
    metric_regex,
)

__all__ = [
    "METRIC_LINE_PREFIX",
    "NAME_PATTERN",
    "NUMBER_PATTERN",
    "PREFIX_PATTERN",
    "check_metric_name",
    "metric_definitions",
    "metric_regex",
    "with_standard_definitions",
]


def with_standard_definitions(definitions: list[dict[str, str]]) -> list[dict[str, str]]:
    """The user's definitions, then those of meshtrain's standard metrics they do not define.

    `meshtrain_runtime.metrics.log()` prints the standard lines, so a job shows loss and throughput
    in SageMaker's console without the user writing regexes. SageMaker allows 40 definitions: the
    standard ones only fill what the user left free.
    """
    taken = {d.get("Name") for d in definitions}
    extra = [d for d in metric_definitions(*STANDARD_METRICS) if d["Name"] not in taken]
    return [*definitions, *extra[: max(0, 40 - len(definitions))]]
