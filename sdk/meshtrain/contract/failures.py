"""Failure records: what a host writes when its ranks fail, and how the root cause is chosen.

A host's bootstrap writes one JSON record (`failure.json` in its work directory) listing every
rank failure it saw, each with the time it happened. The client reads the records of all hosts
and blames the earliest *primary* failure: a rank that raised, or was killed by a signal nobody
in the job sent. Collective errors that a rank only sees because a peer died ("Connection reset
by peer" from gloo, a rank its own agent stopped with SIGTERM) are *secondary*: they are named
as consequences and never chosen while a primary exists.
"""

from __future__ import annotations

import json
import os
import re
import signal
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

HOST_RECORD = "failure.json"  # in the host's work directory (MESHTRAIN_HOST_WORK_DIR)
OOM_INFO = "OutOfMemory: Process killed by SIGKILL (signal 9)"
SECONDARY_ERROR = re.compile(
    r"Connection reset by peer|Connection closed by peer|Broken pipe|gloo/transport|"
    r"NCCL communicator was aborted|DistBackendError|waiting in a collective for a peer",
    re.IGNORECASE)
# Signals a job's own machinery sends to ranks it stops after another rank failed.
STOP_SIGNALS = frozenset({"SIGTERM", "SIGINT", "SIGHUP"})
HOST_STOPPED_EXIT_CODE = 143  # 128 + SIGTERM: a host bootstrap that was sent SIGTERM itself
CONSEQUENCE_TEXT = 70  # characters of each consequence's message in a reason


def signal_name(number: int) -> str:
    """'SIGKILL' for 9; 'signal 77' for a number Python does not name."""
    try:
        return signal.Signals(number).name
    except ValueError:
        return f"signal {number}"


@dataclass(frozen=True)
class RankFailure:
    """One process that failed: a rank (rank set) or a host's own launcher (rank None)."""

    host: str
    rank: int | None
    time: float
    kind: str  # "exception", "signal", "exit" or "host"
    message: str  # one line, the key fact: "ValueError: bad", "killed by SIGKILL (signal 9)"
    detail: str = ""  # traceback or the last lines of output
    signal: str | None = None  # "SIGKILL" when a signal ended the process

    @property
    def secondary(self) -> bool:
        """True when this failure is the likely fallout of another process's failure."""
        if self.signal in STOP_SIGNALS:
            return True
        return SECONDARY_ERROR.search(f"{self.message}\n{self.detail}") is not None

    @property
    def where(self) -> str:
        return f"rank {self.rank} on {self.host}" if self.rank is not None else f"host {self.host}"

    @property
    def headline(self) -> str:
        """`rank 3 on algo-2: killed by SIGKILL (signal 9)`: who and what, on one line."""
        return f"{self.where}: {self.message}"

    @property
    def hint(self) -> str:
        """SageMaker's hint for a SIGKILLed process (the kernel's OOM killer sends SIGKILL)."""
        return OOM_INFO if self.signal == "SIGKILL" else ""

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> RankFailure:
        return cls(**{k: data[k] for k in cls.__dataclass_fields__ if k in data})


def killed_by(host: str, rank: int | None, number: int, when: float,
              verb: str = "killed by") -> RankFailure:
    """The failure of a process that signal `number` ended (`verb`: "stopped by" for a stop)."""
    name = signal_name(number)
    return RankFailure(host, rank, when, "signal", f"{verb} {name} (signal {number})",
                       signal=name)


def pick_root_cause(failures: list[RankFailure]) -> tuple[RankFailure, list[RankFailure]]:
    """(the root cause, the other failures): the earliest primary, else the earliest of all."""
    if not failures:
        raise ValueError("pick_root_cause needs at least one failure")
    primaries = [f for f in failures if not f.secondary]
    root = min(primaries or failures, key=lambda f: f.time)
    others = sorted((f for f in failures if f is not root),
                    key=lambda f: (f.rank is None, f.rank if f.rank is not None else 0, f.host))
    return root, others


def describe_consequences(others: list[RankFailure]) -> str:
    """`Failed as a consequence: rank 0 on algo-1 (RuntimeError: ...), ...` or ''."""
    if not others:
        return ""
    parts = []
    for failure in others:
        text = failure.message.splitlines()[0] if failure.message else failure.kind
        if len(text) > CONSEQUENCE_TEXT:
            text = text[: CONSEQUENCE_TEXT - 3] + "..."
        parts.append(f"{failure.where} ({text})")
    return "Failed as a consequence: " + "; ".join(parts) + "."


def format_reason(root: RankFailure, others: list[RankFailure], limit: int) -> str:
    """Key facts first (who, what, which signal), then the consequences, then the detail;
    cut to `limit` characters so truncation only ever removes the traceback's tail."""
    hint = f'ExtraInfo "{root.hint}"' if root.hint else ""
    parts = [root.headline, hint, describe_consequences(others), root.detail.strip()]
    text = "\n".join(p for p in parts if p)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def write_host_record(path: Path, host: str, exit_code: int,
                      failures: list[RankFailure]) -> None:
    """Write a host's failure record atomically (the client may read it at any time)."""
    path.parent.mkdir(parents=True, exist_ok=True)
    record = {"host": host, "exit_code": exit_code, "failures": [asdict(f) for f in failures]}
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(record, indent=1))
    tmp.replace(path)


def write_rank_record(error_dir: str | Path, report: dict[str, Any]) -> Path:
    """Write a rank's failure record, ``<error_dir>/rank-<rank>.json``, atomically: the rank may
    be ended while it writes (its agent ends a failed job's ranks at once), and a record cut in
    half would lose the rank's failure; the one it replaces stays whole until then."""
    path = Path(error_dir) / f"rank-{report['rank']}.json"
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(report))
    tmp.replace(path)
    return path


def read_host_record(path: Path) -> list[RankFailure]:
    """The failures in a host's record; [] when there is none or it cannot be read."""
    try:
        record = json.loads(path.read_text())
        return [RankFailure.from_dict(item) for item in record.get("failures", [])]
    except (OSError, ValueError, TypeError, KeyError):
        return []
