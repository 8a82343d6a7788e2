"""The order in which xdist workers take the suite's scopes: the longest first.

README's test command runs the suite on 2 workers with ``--dist loadfile``: a worker takes the
next scope (a file, or a shared resource's files) when it runs out of work. In collection order
(alphabetical) the Slurm tier and other long scopes came last, so one worker ran them alone at
the end while the other had nothing left. Taking the longest scopes first (LPT scheduling)
leaves the short ones to fill in at the end. The costs are the wall seconds each scope took in
a whole-suite run, recorded in ``scope_seconds.json`` by

    python3 -m pytest -n auto --dist loadfile -m 'not serial' --record-scope-seconds

A scope missing from the table (a new file) goes first: better early than at the tail.
"""

from __future__ import annotations

import json
from collections import defaultdict
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

SECONDS_FILE = Path(__file__).resolve().parent / "scope_seconds.json"


def read_costs(path: Path = SECONDS_FILE) -> dict[str, float]:
    return json.loads(path.read_text()) if path.exists() else {}


def order_by_cost(items: list[Any], scope_of: Callable[[Any], str],
                  costs: dict[str, float]) -> list[Any]:
    """`items` regrouped by scope (each scope's items in their order), longest scope first;
    a scope without a recorded cost first of all."""
    groups: dict[str, list[Any]] = defaultdict(list)
    for item in items:
        groups[scope_of(item)].append(item)
    unknown = float("inf")
    ranked = sorted(groups, key=lambda scope: -costs.get(scope, unknown))
    return [item for scope in ranked for item in groups[scope]]


def scope_seconds(reports: Iterable[tuple[str, float]], scope_of_nodeid: Callable[[str], str],
                  ) -> dict[str, float]:
    """Wall seconds per scope from (node id, duration) of every phase of every test."""
    seconds: dict[str, float] = defaultdict(float)
    for nodeid, duration in reports:
        seconds[scope_of_nodeid(nodeid)] += duration
    return {scope: round(total, 1) for scope, total in sorted(seconds.items())}
