"""Expected goodput of a job at scale: full restarts from a checkpoint against replica groups.

Goodput is the share of the cluster's time that goes into training steps that count (the
"effective training time" of Llama 3's and FT-HSDP's reports). Failures arrive as a Poisson
process, each GPU at ``1 / gpu_mtbf_hours`` (Llama 3's 466 interruptions in 54 days on 16,384
H100s is one per 45,600 GPU-hours).

**Full restarts** (``replica_groups = 1``): a failure stops every GPU; the job restarts
(``restart_seconds``: detection, relaunch, init), loads the last checkpoint
(``checkpoint_load_seconds``) and redoes the steps since. A failure during the restart restarts
it. The job writes a checkpoint after every ``checkpoint_interval_seconds`` of training
(``checkpoint_write_seconds`` during which nothing trains). Daly's model of exactly this
(J. T. Daly, "A higher order estimate of the optimum checkpoint interval for restart dumps",
FGCS 2006) gives the goodput in closed form, ``tau / (M e^(R/M) (e^((tau + delta)/M) - 1))``,
and the interval that maximises it (`recommended_interval`).

**Replica groups** (``replica_groups = N >= 2``, torch_distributed.fault_tolerance): a failure
takes one group down for ``group_restart_seconds + heal_seconds`` while the others train on
(capacity ``live / N``), after pausing ``stall_seconds`` each (failure detection, the dropped
step, the new quorum). Only when every group is down at once does the job restart from its
checkpoint as above. The closed form (`replica_group_goodput`) treats the groups as
independent up/down processes and the stalls as Poisson coverage; `goodput_sim` simulates the
same process event by event, and the tests hold the two within a point of goodput.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace

from meshtrain.contract.errors import ConfigError

LLAMA3_GPU_MTBF_HOURS = 16_384 * 54 * 24 / 466
"""Llama 3 405B's pre-training: 466 interruptions in 54 days on 16,384 H100s (arXiv
2407.21783): one failure per ~45,600 GPU-hours."""
SECONDS_PER_DAY = 86_400.0
MAX_RECOMMENDED_INTERVAL_SECONDS = SECONDS_PER_DAY
"""The longest interval recommended: past a day between checkpoints the reasons to keep one are
not failures (a preemption, a bug, a changed plan)."""


@dataclass(frozen=True)
class GoodputInputs:
    """A job's size, its failure rate and what a failure costs it (times in seconds)."""

    gpus: int
    gpu_mtbf_hours: float = LLAMA3_GPU_MTBF_HOURS
    replica_groups: int = 1
    restart_seconds: float = 600.0
    """A full restart: detection, relaunch, init, until training could go on (not the load)."""
    checkpoint_write_seconds: float = 60.0
    """The part of a checkpoint save during which nothing trains."""
    checkpoint_load_seconds: float = 60.0
    checkpoint_interval_seconds: float | None = None
    """Training time between checkpoints; None: the recommended one."""
    group_restart_seconds: float = 120.0
    """A replica group's restart, until it asks to join (its hosts, imports, init)."""
    heal_seconds: float = 10.0
    """A restarted group's copy of the model and optimizer from a live peer."""
    stall_seconds: float = 5.0
    """The other groups' pause at each failure: detection, the dropped step, the new quorum."""
    measured: dict[str, str] = field(default_factory=dict, compare=False)
    """Which inputs came from a job's measurements (name -> where)."""

    def __post_init__(self) -> None:
        check_inputs(self)

    @property
    def job_mtbf_seconds(self) -> float:
        """Mean time between failures of the whole job."""
        return self.gpu_mtbf_hours * 3600.0 / self.gpus

    @property
    def group_failure_rate(self) -> float:
        """Failures per second of one replica group while it runs."""
        return 1.0 / (self.job_mtbf_seconds * self.replica_groups)

    @property
    def group_down_seconds(self) -> float:
        return self.group_restart_seconds + self.heal_seconds

    @property
    def full_restart_seconds(self) -> float:
        return self.restart_seconds + self.checkpoint_load_seconds


def check_inputs(inputs: GoodputInputs) -> None:
    """ConfigError (with the fix) for inputs no job can have."""
    if inputs.gpus < 1:
        raise ConfigError(f"gpus={inputs.gpus}: a job has at least 1 GPU.")
    if not (inputs.gpu_mtbf_hours > 0 and math.isfinite(inputs.gpu_mtbf_hours)):
        raise ConfigError(f"gpu_mtbf_hours={inputs.gpu_mtbf_hours}: give the hours between "
                          f"failures of one GPU, > 0 (Llama 3's: {LLAMA3_GPU_MTBF_HOURS:.0f}).")
    if not 1 <= inputs.replica_groups <= inputs.gpus:
        raise ConfigError(f"replica_groups={inputs.replica_groups}: between 1 (full restarts) "
                          f"and the {inputs.gpus} GPUs.")
    times = {"restart_seconds": inputs.restart_seconds,
             "checkpoint_write_seconds": inputs.checkpoint_write_seconds,
             "checkpoint_load_seconds": inputs.checkpoint_load_seconds,
             "group_restart_seconds": inputs.group_restart_seconds,
             "heal_seconds": inputs.heal_seconds, "stall_seconds": inputs.stall_seconds}
    for name, value in times.items():
        if not (value >= 0 and math.isfinite(value)):
            raise ConfigError(f"{name}={value}: a duration in seconds, >= 0.")
    interval = inputs.checkpoint_interval_seconds
    if interval is not None and not (interval > 0 and math.isfinite(interval)):
        raise ConfigError(f"checkpoint_interval_seconds={interval}: training seconds between "
                          "checkpoints, > 0 (or leave it out for the recommended one).")


def recommended_interval(write_seconds: float, mtbf_seconds: float) -> float:
    """Daly's higher-order optimum checkpoint interval (Young's ``sqrt(2 delta M)`` to first
    order); M when a write costs 2 M or more."""
    if write_seconds <= 0:
        return mtbf_seconds  # free checkpoints: as often as anything else allows; M bounds it
    ratio = write_seconds / (2.0 * mtbf_seconds)
    if ratio >= 1.0:
        return mtbf_seconds
    young = math.sqrt(2.0 * write_seconds * mtbf_seconds)
    return young * (1.0 + math.sqrt(ratio) / 3.0 + ratio / 9.0) - write_seconds


def full_restart_goodput(mtbf_seconds: float, restart_seconds: float, write_seconds: float,
                         interval_seconds: float) -> float:
    """Daly's expected goodput of checkpoint/restart: each segment of training plus its write
    must finish without a failure; a failure costs what the segment had done plus a restart
    (``restart_seconds``, itself restarted by a failure)."""
    m = mtbf_seconds
    segment = (interval_seconds + write_seconds) / m
    if segment > 700 or restart_seconds / m > 700:  # e^x overflows: no segment ever finishes
        return 0.0
    return interval_seconds / (m * math.exp(restart_seconds / m) * math.expm1(segment))


def all_down_rate(inputs: GoodputInputs) -> float:
    """Replica groups: how often every group is down at once (the last live one fails), per
    second; the job then restarts from its checkpoint."""
    n, rate = inputs.replica_groups, inputs.group_failure_rate
    up = 1.0 / (1.0 + rate * inputs.group_down_seconds)
    return n * rate * up * (1.0 - up) ** (n - 1)


def replica_group_goodput(inputs: GoodputInputs, interval_seconds: float) -> float:
    """Expected goodput with N >= 2 replica groups: the live share of capacity, less the other
    groups' stalls, the checkpoint writes and the (rare) restarts of the whole job."""
    n, rate = inputs.replica_groups, inputs.group_failure_rate
    up = 1.0 / (1.0 + rate * inputs.group_down_seconds)  # a group's share of time up
    stall_free = math.exp(-(n - 1) * up * rate * inputs.stall_seconds)  # no other's stall
    write = inputs.checkpoint_write_seconds
    restarts = all_down_rate(inputs) * (inputs.full_restart_seconds
                                        + (interval_seconds + write) / 2.0)
    return (interval_seconds / (interval_seconds + write)) * up * stall_free * max(
        0.0, 1.0 - restarts)


@dataclass(frozen=True)
class StrategyEstimate:
    """One way of running the job: its goodput and checkpoint interval."""

    name: str
    replica_groups: int
    goodput: float
    checkpoint_interval_seconds: float
    recommended_interval_seconds: float
    restart_mtbf_seconds: float
    """Mean time between restarts of the whole job from its checkpoint."""


@dataclass(frozen=True)
class GoodputEstimate:
    inputs: GoodputInputs
    full_restarts: StrategyEstimate
    replica_groups: StrategyEstimate | None
    failures_per_day: float
    restarts_per_group_per_day: float | None

    @property
    def best(self) -> StrategyEstimate:
        options = [self.full_restarts, *([self.replica_groups] if self.replica_groups else [])]
        return max(options, key=lambda s: s.goodput)


def estimate_full_restarts(inputs: GoodputInputs) -> StrategyEstimate:
    m = inputs.job_mtbf_seconds
    recommended = min(recommended_interval(inputs.checkpoint_write_seconds, m),
                      MAX_RECOMMENDED_INTERVAL_SECONDS)
    interval = inputs.checkpoint_interval_seconds or recommended
    goodput = full_restart_goodput(m, inputs.full_restart_seconds,
                                   inputs.checkpoint_write_seconds, interval)
    return StrategyEstimate("full restarts", 1, goodput, interval, recommended, m)


def estimate_replica_groups(inputs: GoodputInputs) -> StrategyEstimate:
    rate = all_down_rate(inputs)
    restart_mtbf = 1.0 / rate if rate > 0 else math.inf
    recommended = MAX_RECOMMENDED_INTERVAL_SECONDS
    if math.isfinite(restart_mtbf):
        recommended = min(recommended_interval(inputs.checkpoint_write_seconds, restart_mtbf),
                          recommended)
    interval = inputs.checkpoint_interval_seconds or recommended
    goodput = replica_group_goodput(inputs, interval)
    return StrategyEstimate(f"{inputs.replica_groups} replica groups", inputs.replica_groups,
                            goodput, interval, recommended, restart_mtbf)


def estimate_goodput(inputs: GoodputInputs) -> GoodputEstimate:
    """Both strategies for `inputs` (replica groups only when ``replica_groups >= 2``)."""
    full = estimate_full_restarts(replace(inputs, replica_groups=1))
    groups = estimate_replica_groups(inputs) if inputs.replica_groups >= 2 else None
    per_day = SECONDS_PER_DAY / inputs.job_mtbf_seconds
    per_group = per_day / inputs.replica_groups if groups else None
    return GoodputEstimate(inputs, full, groups, per_day, per_group)


__all__ = ["LLAMA3_GPU_MTBF_HOURS", "MAX_RECOMMENDED_INTERVAL_SECONDS", "GoodputEstimate",
           "GoodputInputs", "StrategyEstimate", "all_down_rate", "estimate_goodput",
           "full_restart_goodput", "recommended_interval", "replica_group_goodput"]
