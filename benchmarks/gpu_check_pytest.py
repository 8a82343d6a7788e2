"""A pytest plugin for gpu_check.py's "pytest" section (``-p gpu_check_pytest``).

It appends one JSON line per finished test to the file named by ``GPU_CHECK_PYTEST_LOG``, as
the test finishes: a section cut at its time cap still reports every test that ended. A line:
``{"test": node id, "outcome": passed|failed|skipped, "seconds": ..., "reason": skip reason or
the failure's last line, "figures": [what the test recorded with record_property("figure")]}``.
"""

from __future__ import annotations

import json
import os
from typing import Any

import pytest

LOG_VARIABLE = "GPU_CHECK_PYTEST_LOG"


def _line(report: pytest.TestReport) -> dict[str, Any]:
    reason = ""
    if report.skipped and isinstance(report.longrepr, tuple):
        reason = str(report.longrepr[2]).removeprefix("Skipped: ")
    elif report.failed:
        reason = str(report.longrepr).strip().splitlines()[-1][:500] if report.longrepr else ""
    figures = [str(value) for key, value in report.user_properties if key == "figure"]
    return {"test": report.nodeid, "outcome": report.outcome, "seconds": report.duration,
            "reason": reason, "figures": figures}


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    """Write the call phase (or a setup that skipped or failed, or a failed teardown)."""
    path = os.environ.get(LOG_VARIABLE)
    if not path:
        return
    if report.when == "call" or (report.when == "setup" and not report.passed) or (
            report.when == "teardown" and report.failed):
        with open(path, "a") as handle:
            handle.write(json.dumps(_line(report)) + "\n")
