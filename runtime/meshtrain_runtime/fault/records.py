"""One JSON line per step from each replica group's rank 0 (docs/fault-tolerance.md), and one per
checkpoint it saved or loaded.

``<SM_OUTPUT_DATA_DIR or /opt/ml/output/data>/fault_tolerance/replica-<g>.jsonl`` and
``checkpoints-<g>.jsonl``; the backend reads these files for the job's Goodput, Recoveries and
the measured times ``meshtrain plan --goodput`` starts from.
"""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from meshtrain.contract.env import SM_OUTPUT_DATA_DIR
from meshtrain.contract.fault_tolerance import RECORDS_FOLDER
from meshtrain.contract.paths import OptMLPaths


@dataclass(frozen=True)
class StepRecord:
    """One step of one replica group, as its JSON line holds it."""

    step: int
    """The step number this step ran as (the committed steps before it)."""
    replica_group: int
    participants: list[int]
    """The replica groups of this step's quorum, sorted."""
    committed: bool
    began: float
    """Unix time when the step began (its quorum was asked for)."""
    quorum_seconds: float
    """How long the step's quorum took (a heal from a peer included)."""
    time: float
    """Unix time when the step ended (after the commit decision)."""
    healed: bool
    """This step began by copying model and optimizer state from a live peer."""
    loss: float | None
    """This group's mean loss (over its ranks) when the script used forward_backward."""
    effective_batch: int | None
    """Rows the committed step averaged over: rows per rank x ranks per group x participants
    (None when the step did not commit or no forward pass saw a batch tensor)."""


def records_path(replica_group: int, environ: dict[str, str] | None = None, *,
                 kind: str = "replica") -> Path:
    """Where replica group `replica_group`'s lines of `kind` (replica: steps, checkpoints) go."""
    env = os.environ if environ is None else environ
    data_dir = env.get(SM_OUTPUT_DATA_DIR) or str(OptMLPaths.from_env(env).output_data_dir)
    return Path(data_dir) / RECORDS_FOLDER / f"{kind}-{replica_group}.jsonl"


class RecordWriter:
    """Appends `StepRecord` lines to one file, flushed per line (a killed group keeps them)."""

    def __init__(self, path: Path) -> None:
        path.parent.mkdir(parents=True, exist_ok=True)
        self.path = path

    def write(self, record: StepRecord | dict) -> None:
        line = record if isinstance(record, dict) else asdict(record)
        with self.path.open("a") as handle:
            handle.write(json.dumps(line) + "\n")


__all__ = ["RecordWriter", "StepRecord", "records_path"]
