"""A fault-tolerant job's figures, from the step records its replica groups wrote and the failures
its supervisor saw: goodput, one recovery per failure, and the progress line's values.

Each replica group's rank 0 writes one JSON line per step to
``<output data dir>/fault_tolerance/replica-<g>.jsonl`` (``step``, ``replica_group``,
``participants``: the groups in that step's quorum, ``committed``, ``time``, ``healed``,
``loss``). The supervisor records each group failure in status.json (``FaultToleranceEvents``:
``ReplicaGroup``, ``FailedAt``, ``RestartedAt``).

Definitions (docs/fault-tolerance.md):

- **Goodput** = committed replica-steps / (replica groups x committed steps): the share of the
  job's replica capacity that did useful work. A step the quorum committed with k of N groups
  counts k; 1.0 means every group took part in every step.
- **Recovery** (one per failure): ``DownSeconds`` from the failure to the group's first committed
  step after it came back; ``StepsWithoutIt``, the steps committed without the group between its
  last step before the failure and its first step after; ``RejoinSecondsAfterRestart``, from the
  backend's restart to that first step.
"""

from __future__ import annotations

import contextlib
import itertools
import json
import statistics
from collections.abc import Iterable
from pathlib import Path
from typing import Any

from meshtrain.contract.fault_tolerance import RECORDS_FOLDER
from meshtrain.contract.metrics import format_metrics_line

GOODPUT_DEFINITION = "committed replica-steps / (replica groups x committed steps)"


def read_step_records(output_data_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every step record under the hosts' output data dirs (a half-written last line is
    skipped), one per (group, step): the latest written wins (a restarted group may repeat)."""
    latest: dict[tuple[int, int], dict[str, Any]] = {}
    for folder in output_data_dirs:
        for path in sorted((folder / RECORDS_FOLDER).glob("replica-*.jsonl")):
            try:
                text = path.read_text(errors="replace")
            except OSError:
                continue
            for line in text.splitlines():
                try:
                    record = json.loads(line)
                    latest[(int(record["replica_group"]), int(record["step"]))] = record
                except (ValueError, KeyError, TypeError):
                    continue
    return sorted(latest.values(), key=lambda r: (r["step"], r["replica_group"]))


def read_checkpoint_records(output_data_dirs: Iterable[Path]) -> list[dict[str, Any]]:
    """Every checkpoint a group saved or loaded (``checkpoints-<g>.jsonl``: kind, seconds)."""
    found = []
    for folder in output_data_dirs:
        for path in sorted((folder / RECORDS_FOLDER).glob("checkpoints-*.jsonl")):
            with contextlib.suppress(OSError):
                for line in path.read_text(errors="replace").splitlines():
                    with contextlib.suppress(ValueError):
                        found.append(json.loads(line))
    return found


def step_participants(records: list[dict[str, Any]]) -> dict[int, set[int]]:
    """For each committed step, the replica groups that took part in it."""
    steps: dict[int, set[int]] = {}
    for record in records:
        if record.get("committed"):
            steps.setdefault(int(record["step"]), set()).update(
                int(g) for g in record.get("participants", []))
    return steps


def recovery(event: dict[str, Any], records: list[dict[str, Any]],
             steps: dict[int, set[int]]) -> dict[str, Any]:
    """One failure of one group, measured from the records."""
    group, failed_at = int(event["ReplicaGroup"]), float(event["FailedAt"])
    own = [r for r in records if int(r["replica_group"]) == group and r.get("committed")]
    before = [int(r["step"]) for r in own if float(r["time"]) <= failed_at]
    back_after = float(event.get("RestartedAt") or failed_at)
    after = [r for r in own if float(r["time"]) > back_after
             and group in {int(g) for g in r.get("participants", [])}]
    last_before = max(before, default=-1)
    first_after = min(after, key=lambda r: int(r["step"])) if after else None
    upper = int(first_after["step"]) if first_after else max(steps, default=-1) + 1
    without = sum(1 for step, groups in steps.items()
                  if last_before < step < upper and group not in groups)
    result: dict[str, Any] = {
        "ReplicaGroup": group, "FailedAt": failed_at, "RestartedAt": event.get("RestartedAt"),
        "Rejoined": first_after is not None, "StepsWithoutIt": without,
        "DownSeconds": None, "RejoinSecondsAfterRestart": None,
    }
    if first_after is not None:
        rejoined = float(first_after["time"])
        result.update(RejoinedAt=rejoined, RejoinedAtStep=int(first_after["step"]),
                      DownSeconds=round(rejoined - failed_at, 3))
        if event.get("RestartedAt"):
            result["RejoinSecondsAfterRestart"] = round(rejoined - float(event["RestartedAt"]), 3)
        if "began" in first_after:  # from the failure until it asked to join; its heal
            result["RestartSeconds"] = round(float(first_after["began"]) - failed_at, 3)
            result["HealSeconds"] = first_after.get("quorum_seconds")
    result["SurvivorGapSeconds"] = survivor_gap(group, failed_at, records)
    return result


def survivor_gap(group: int, failed_at: float, records: list[dict[str, Any]]) -> float | None:
    """The longest time another group went without a committed step at this failure: from its
    commit before its first step without `group` (after `group`'s last commit before the
    failure) to that step's commit; failure detection included."""
    own = [float(r["time"]) for r in records if int(r["replica_group"]) == group
           and r.get("committed") and float(r["time"]) <= failed_at]
    since = max(own, default=failed_at)
    gaps = []
    for other in {int(r["replica_group"]) for r in records} - {group}:
        commits = sorted((float(r["time"]), r) for r in records
                         if int(r["replica_group"]) == other and r.get("committed"))
        for (before, _), (after, record) in itertools.pairwise(commits):
            if after > since and group not in record.get("participants", []):
                gaps.append(after - before)
                break
    return round(max(gaps), 3) if gaps else None


def measured_times(records: list[dict[str, Any]], recoveries: list[dict[str, Any]],
                   checkpoints: list[dict[str, Any]]) -> dict[str, float | None]:
    """The job's measured costs of a failure and of a checkpoint (medians), what
    ``meshtrain plan --goodput --from-job`` starts from: a group's restart until it asks to
    join, its heal, the other groups' stall (their gap less their usual step interval), and a
    checkpoint's write and load."""
    intervals = []
    for group in {int(r["replica_group"]) for r in records}:
        times = sorted(float(r["time"]) for r in records
                       if int(r["replica_group"]) == group and r.get("committed"))
        intervals += [b - a for a, b in itertools.pairwise(times)]
    usual = _median(intervals) or 0.0
    gaps = [r["SurvivorGapSeconds"] - usual for r in recoveries if r.get("SurvivorGapSeconds")]
    return {
        "GroupRestartSeconds": _median([r["RestartSeconds"] for r in recoveries
                                        if r.get("RestartSeconds") is not None]),
        "HealSeconds": _median([r["HealSeconds"] for r in recoveries
                                if r.get("HealSeconds") is not None]),
        "StallSeconds": _median([max(0.0, gap) for gap in gaps]),
        "StepSeconds": _median(intervals),
        "CheckpointWriteSeconds": _median([c["seconds"] for c in checkpoints
                                           if c.get("kind") == "write"]),
        "CheckpointLoadSeconds": _median([c["seconds"] for c in checkpoints
                                          if c.get("kind") == "load"]),
    }


def _median(values: list[float]) -> float | None:
    return round(statistics.median(values), 3) if values else None


def fault_tolerance_summary(records: list[dict[str, Any]], events: list[dict[str, Any]],
                            replica_groups: int,
                            checkpoints: list[dict[str, Any]] | None = None) -> dict[str, Any]:
    """describe()["FaultTolerance"]: Goodput (0..1), Recoveries (one per failure) and counts."""
    steps = step_participants(records)
    replica_steps = sum(len(groups) for groups in steps.values())
    capacity = replica_groups * len(steps)
    recoveries = [recovery(event, records, steps) for event in events]
    down = {r["ReplicaGroup"] for r in recoveries if not r["Rejoined"]}
    latest = (steps[max(steps)] if steps else set()) - down  # a failed group is not live
    return {
        "ReplicaGroups": replica_groups,
        "Goodput": round(replica_steps / capacity, 6) if capacity else None,
        "GoodputDefinition": GOODPUT_DEFINITION,
        "CommittedSteps": len(steps),
        "ReplicaSteps": replica_steps,
        "LiveReplicaGroups": len(latest),
        "Recoveries": recoveries,
        "LostReplicaGroups": sorted({int(e["ReplicaGroup"]) for e in events
                                     if e.get("Lost")}),
        "Measured": measured_times(records, recoveries, checkpoints or []),
    }


def progress_metrics_line(summary: dict[str, Any]) -> str | None:
    """The metric line the progress display reads (ft:* values), once a step was committed."""
    if summary.get("Goodput") is None:
        return None
    return format_metrics_line({
        "ft:live_replicas": float(summary["LiveReplicaGroups"]),
        "ft:replica_groups": float(summary["ReplicaGroups"]),
        "ft:goodput": float(summary["Goodput"]),
        "ft:recoveries": float(len(summary["Recoveries"])),
    })
