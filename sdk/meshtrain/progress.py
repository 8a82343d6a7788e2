"""Training progress read from a job's metric lines: step of total, loss, tokens/s, MFU, ETA.

Every backend's log carries the lines `meshtrain_runtime.metrics.log()` prints
(:mod:`meshtrain.contract.metrics`); a :class:`ProgressTracker` is fed those lines as they
arrive and says where the job is. The total comes from a ``train:total_steps`` metric (what
``metrics.log(total_steps=...)`` prints) or, before one arrives, from a ``max_steps`` /
``total_steps`` hyperparameter. The ETA is the remaining steps at the pace of the steps seen
so far (timed when each step's first line arrived), so start-up time does not skew it.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from meshtrain.contract.metrics import MetricRecord, parse_metric_records
from meshtrain.contract.phases import Phase, parse_phase_line

TOTAL_STEPS_METRIC = "train:total_steps"
TOTAL_STEPS_HYPERPARAMETERS = ("max_steps", "total_steps")


@dataclass(frozen=True)
class Progress:
    """Where a job stands; None where its log has not said yet."""

    step: int | None = None
    total_steps: int | None = None
    loss: float | None = None
    tokens_per_sec: float | None = None
    mfu: float | None = None
    eta_seconds: float | None = None
    elapsed_seconds: float | None = None
    """Set once the job has ended: how long it ran (shown as ``ran H:MM:SS``)."""
    fault_tolerance: tuple[int, int, float, int] | None = None
    """A fault-tolerant job's (live replica groups, replica groups, goodput, recoveries), from
    the ``ft:*`` metric lines its supervisor writes (meshtrain.backends.hosts.ft_metrics)."""

    def summary(self) -> str:
        """One plain line, e.g. ``step 40/100 · loss 2.3100 · 1,234 tokens/s · ETA 0:01:12``."""
        ran = ([f"ran {format_duration(self.elapsed_seconds)}"]
               if self.elapsed_seconds is not None else [])
        if self.step is None:
            return " · ".join(ran) or "no step reported yet"
        parts = [f"step {self.step}/{self.total_steps}" if self.total_steps else
                 f"step {self.step}"]
        if self.loss is not None:
            parts.append(f"loss {self.loss:.4f}")
        if self.tokens_per_sec is not None:
            parts.append(f"{self.tokens_per_sec:,.0f} tokens/s")
        if self.mfu is not None:
            parts.append(f"MFU {self.mfu:.1%}")
        if self.fault_tolerance is not None:
            live, groups, goodput, recoveries = self.fault_tolerance
            parts.append(f"replicas {live}/{groups} · goodput {goodput:.1%} · "
                         f"{recoveries} recover{'y' if recoveries == 1 else 'ies'}")
        if self.eta_seconds is not None:
            parts.append(f"ETA {format_duration(self.eta_seconds)}")
        return " · ".join(parts + ran)


def format_duration(seconds: float) -> str:
    """``H:MM:SS`` (rounded up: an ETA of 0.4 s is not "0:00:00" while work remains)."""
    total = max(0, math.ceil(seconds))
    hours, rest = divmod(total, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}"


def total_steps_from(hyperparameters: Mapping[str, Any] | None) -> int | None:
    """A positive integer `max_steps` / `total_steps` hyperparameter, if the job has one."""
    for key in TOTAL_STEPS_HYPERPARAMETERS:
        value = (hyperparameters or {}).get(key)
        try:
            steps = int(str(value))
        except ValueError:
            continue
        if steps > 0:
            return steps
    return None


class ProgressTracker:
    """Fold metric lines into a :class:`Progress`; `clock` is when each line was seen."""

    def __init__(self, total_steps: int | None = None,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.total_steps = total_steps
        self.clock = clock
        self.started = clock()  # when the client began to follow the job
        self.step: int | None = None
        self.values: dict[str, float] = {}
        self._first: tuple[int, float] | None = None  # (step, time) of the first step seen
        self._latest: tuple[int, float] | None = None

    def feed(self, line: str) -> bool:
        """Take one log line; True if it was a metric line (one value or several)."""
        records = parse_metric_records(line)
        for record in records:
            self._take(record)
        return bool(records)

    def _take(self, record: MetricRecord) -> None:
        if record.name == TOTAL_STEPS_METRIC:
            self.total_steps = int(record.value) if record.value > 0 else None
            return
        if math.isfinite(record.value):
            self.values[record.name] = record.value
        if record.step is not None and (self.step is None or record.step > self.step):
            self._observe_step(record.step)

    def _observe_step(self, step: int) -> None:
        now = self.clock()
        self.step = step
        self._latest = (step, now)
        if self._first is None:
            self._first = (step, now)

    def elapsed_seconds(self) -> float:
        """Seconds since the client began to follow the job (fit(): since it started)."""
        return self.clock() - self.started

    def steps_per_second(self) -> float | None:
        """The pace between the first and the latest step seen (None until two were)."""
        if self._first is None or self._latest is None:
            return None
        steps = self._latest[0] - self._first[0]
        seconds = self._latest[1] - self._first[1]
        return steps / seconds if steps > 0 and seconds > 0 else None

    def eta_seconds(self) -> float | None:
        """Seconds left at the pace so far, counted from the latest step's arrival."""
        pace = self.steps_per_second()
        if pace is None or self.total_steps is None or self.step is None or self._latest is None:
            return None
        remaining = max(0, self.total_steps - self.step) / pace
        return max(0.0, remaining - (self.clock() - self._latest[1]))

    def progress(self) -> Progress:
        return Progress(step=self.step, total_steps=self.total_steps,
                        loss=self.values.get("train:loss"),
                        tokens_per_sec=self.values.get("train:tokens_per_sec"),
                        mfu=self.values.get("train:mfu"), eta_seconds=self.eta_seconds(),
                        fault_tolerance=self._fault_tolerance())

    def _fault_tolerance(self) -> tuple[int, int, float, int] | None:
        names = ("ft:live_replicas", "ft:replica_groups", "ft:goodput", "ft:recoveries")
        if not all(name in self.values for name in names):
            return None
        live, groups, goodput, recoveries = (self.values[name] for name in names)
        return int(live), int(groups), goodput, int(recoveries)


class StartPhases:
    """The phases of a job's start (meshtrain.contract.phases) as its log announces them: each
    phase once, from the first host or rank that reaches it."""

    def __init__(self) -> None:
        self.seen: set[Phase] = set()
        self.latest: str | None = None
        """The latest phase's detail (what the live line shows until the first step)."""

    def feed(self, line: str) -> str | None:
        """The detail of a phase `line` announces for the first time, else None."""
        record = parse_phase_line(line)
        if record is None or record.phase in self.seen:
            return None
        self.seen.add(record.phase)
        self.latest = record.detail
        return record.detail


def progress_of_log(lines: Any, hyperparameters: Mapping[str, Any] | None = None,
                    training_seconds: float | None = None) -> Progress:
    """The progress a job's log shows. A log has no times, so the ETA (of a running job) is
    paced by `training_seconds`, the time the job has trained so far, over the steps done."""
    tracker = ProgressTracker(total_steps_from(hyperparameters), clock=lambda: 0.0)  # no pace
    for line in lines:
        tracker.feed(line)
    progress = tracker.progress()
    step, total = progress.step, progress.total_steps
    if training_seconds and step and total:
        eta = max(0, total - step) * training_seconds / step
        progress = dataclasses.replace(progress, eta_seconds=eta)
    return progress
