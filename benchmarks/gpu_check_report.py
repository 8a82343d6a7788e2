"""gpu_check.py's report: its sections, the check that none is missing, and its markdown.

A report is a JSON object: ``device``, ``date``, ``smoke``, ``environment``, ``multi_rank``
(the paths one GPU cannot check, each with its reason) and ``sections``, one per name in
SECTIONS, each with ``status`` (passed | failed | skipped | cut | not_run), ``seconds``,
``reason`` and its own results (``tests``, ``rows``, ``pairs``). A section that passed must
hold its results; `problems` lists what is wrong with a report, and gpu_check.py fails a run
whose report has any (as the CI test of the smoke run does).
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

SECTIONS = ("pytest", "planner", "throughput", "docker")
STATUSES = ("passed", "failed", "skipped", "cut", "not_run")
RESULTS_KEY = {"pytest": "tests", "planner": "rows", "throughput": "pairs", "docker": "job"}
GIB = 1024**3


def problems(report: dict[str, Any]) -> list[str]:
    """What makes `report` incomplete: a section missing, without a status, or passed without
    its results; the multi-rank list missing. Empty when the report is whole."""
    found = []
    sections = report.get("sections", {})
    for name in SECTIONS:
        section = sections.get(name)
        if section is None:
            found.append(f"section missing: {name}")
        elif section.get("status") not in STATUSES:
            found.append(f"section {name}: status {section.get('status')!r} is not one of "
                         f"{', '.join(STATUSES)}")
        elif section["status"] == "passed" and not section.get(RESULTS_KEY[name]):
            found.append(f"section {name}: passed but holds no {RESULTS_KEY[name]}")
    if "multi_rank" not in report:
        found.append("section missing: multi_rank")
    return found


def file_stem(device: str, date: str, only: list[str] | None = None) -> str:
    """gpu-<device>-<date>: the device name in lower case, words joined by '-'; a run of some
    sections only (--only) adds their names, so that it does not overwrite the whole run's."""
    slug = re.sub(r"[^a-z0-9]+", "-", device.lower()).strip("-") or "unknown"
    return "-".join(["gpu", slug, date, *(only or [])])


def write(report: dict[str, Any], out: Path) -> tuple[Path, Path]:
    """Write the .json and .md of `report` into `out` (again after every section)."""
    out.mkdir(parents=True, exist_ok=True)
    stem = file_stem(report["device"], report["date"], report.get("only"))
    json_path, md_path = out / f"{stem}.json", out / f"{stem}.md"
    json_path.write_text(json.dumps(report, indent=1, default=str))
    md_path.write_text(markdown(report))
    return json_path, md_path


def summary_table(report: dict[str, Any]) -> str:
    """One row per section: status, seconds and its headline."""
    lines = ["| section | status | seconds | headline |", "|---|---|---|---|"]
    for name in SECTIONS:
        section = report["sections"].get(name)
        if section is None:
            lines.append(f"| {name} | MISSING | | |")
            continue
        lines.append(f"| {name} | {section['status']} | {section.get('seconds', 0):.0f} | "
                     f"{section.get('headline') or section.get('reason', '')} |")
    return "\n".join(lines)


def _pytest_lines(section: dict[str, Any]) -> list[str]:
    lines = ["| test | outcome | s | reason / figures |", "|---|---|---|---|"]
    for test in section.get("tests", []):
        note = "; ".join(filter(None, [test.get("reason", ""), *test.get("figures", [])]))
        lines.append(f"| {test['test'].split('::', 1)[-1]} | {test['outcome']} | "
                     f"{test['seconds']:.1f} | {note} |")
    return lines


def _planner_lines(section: dict[str, Any]) -> list[str]:
    lines = ["| layout | phase | measured MiB | planned MiB | measured / planned |",
             "|---|---|---|---|---|"]
    for row in section.get("rows", []):
        measured = row["measured_bytes"]
        ratio = "-" if row["ratio"] is None else f"{row['ratio']:.3f}"
        lines.append(f"| {row['layout']} | {row['phase']} | "
                     f"{'-' if measured is None else f'{measured / 2**20:.1f}'} | "
                     f"{row['planned_bytes'] / 2**20:.1f} | {ratio} |")
    return lines


def _throughput_lines(section: dict[str, Any]) -> list[str]:
    return section.get("table", "").splitlines()


def markdown(report: dict[str, Any]) -> str:
    """The whole report: the summary, each section's table, the multi-rank paths."""
    env = report.get("environment", {})
    lines = [f"# gpu-check: {report['device']}, {report['date']}"
             + (" (smoke run on CPU: checks the script, not the GPU)" if report["smoke"] else ""),
             "", ", ".join(f"{k} {v}" for k, v in env.items()), "", summary_table(report)]
    renderers = {"pytest": _pytest_lines, "planner": _planner_lines,
                 "throughput": _throughput_lines}
    for name in SECTIONS:
        section = report["sections"].get(name)
        if section is None:
            continue
        lines += ["", f"## {name}: {section['status']}", ""]
        if section.get("reason"):
            lines += [section["reason"], ""]
        lines += renderers.get(name, lambda s: [json.dumps(s["job"])] if s.get("job") else [])(
            section)
    lines += ["", "## multi-rank paths (not checked on one GPU)", ""]
    lines += [f"- {row['path']}: {row['reason']}" for row in report.get("multi_rank", [])]
    return "\n".join(lines) + "\n"
