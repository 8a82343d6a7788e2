"""A Monte Carlo run of failures over a job: the process goodput.py puts in closed form,
simulated event by event (seeded; pure Python), to check the closed form and to find the best
checkpoint interval by trying several.

What happens, as goodput.py says: each replica group fails at its rate while it runs; a failed
group is down for its restart and heal; every failure pauses the groups that run for the stall;
when the last live group fails, the whole job loses what it did since its last completed
checkpoint, restarts (a failure during the restart restarts it) and loads the checkpoint, with
every group back. Checkpoints take ``checkpoint_write_seconds`` after every
``checkpoint_interval_seconds`` of training time. With one group this is checkpoint/restart.
"""

from __future__ import annotations

import heapq
import math
import random
from dataclasses import dataclass

from meshtrain.plan.goodput import GoodputInputs


@dataclass
class _Run:
    """The simulated job's state."""

    inputs: GoodputInputs
    interval: float
    rng: random.Random
    time: float = 0.0
    running: float = 0.0  # time since the last (re)start, for the checkpoint cycle
    done: float = 0.0  # useful work so far (capacity-seconds / N)
    saved: float = 0.0  # useful work as of the last completed checkpoint
    stall_until: float = 0.0
    live: int = 0

    def compute_between(self, start: float, end: float) -> float:
        """Training time (not checkpoint writes) in running-time [start, end)."""
        cycle = self.interval + self.inputs.checkpoint_write_seconds

        def trained(r: float) -> float:
            whole, rest = divmod(r, cycle)
            return whole * self.interval + min(rest, self.interval)

        return trained(end) - trained(start)

    def advance(self, until: float) -> None:
        """Integrate useful work to `until`, noting it at the last checkpoint completed."""
        share = self.live / self.inputs.replica_groups
        start, end = self.running, self.running + (until - self.time)
        paused_to = start + max(0.0, min(self.stall_until, until) - self.time)

        def work_at(r: float) -> float:
            return self.done + share * self.compute_between(paused_to, max(paused_to, r))

        cycle = self.interval + self.inputs.checkpoint_write_seconds
        last_checkpoint = math.floor(end / cycle) * cycle  # a write ends at each multiple
        if last_checkpoint > start:
            self.saved = work_at(last_checkpoint)
        self.done = work_at(end)
        self.running, self.time = end, until


def simulate(inputs: GoodputInputs, interval: float, *, failures: int = 20_000,
             seed: int = 0) -> float:
    """Goodput of one simulated run of `failures` failures with checkpoints every `interval`
    seconds of training; the same `seed` draws the same failures (common random numbers)."""
    run = _Run(inputs, interval, random.Random(seed), live=inputs.replica_groups)
    rate = inputs.group_failure_rate
    events: list[tuple[float, int, int]] = []  # (time, kind: 0 fail 1 back, group)
    for group in range(inputs.replica_groups):
        heapq.heappush(events, (run.rng.expovariate(rate), 0, group))
    seen = 0
    while seen < failures:
        when, kind, group = heapq.heappop(events)
        run.advance(when)
        if kind == 1:  # back from its restart and heal
            run.live += 1
            heapq.heappush(events, (when + run.rng.expovariate(rate), 0, group))
            continue
        seen += 1
        run.live -= 1
        if run.live == 0:
            _restart_everything(run, events)
            continue
        run.stall_until = max(run.stall_until, when + inputs.stall_seconds)
        heapq.heappush(events, (when + inputs.group_down_seconds, 1, group))
    return run.done / run.time


def _restart_everything(run: _Run, events: list[tuple[float, int, int]]) -> None:
    """Every group is down: back to the last checkpoint after a full restart and load, which a
    failure of the whole cluster during it starts again."""
    inputs = run.inputs
    run.done = run.saved
    cluster_rate = 1.0 / inputs.job_mtbf_seconds
    start = run.time
    while True:
        next_failure = run.rng.expovariate(cluster_rate)
        if next_failure >= inputs.full_restart_seconds:
            break
        start += next_failure
    run.time, run.running, run.stall_until = start + inputs.full_restart_seconds, 0.0, 0.0
    run.live = inputs.replica_groups
    events.clear()
    for group in range(inputs.replica_groups):
        heapq.heappush(events, (run.time + run.rng.expovariate(inputs.group_failure_rate), 0,
                                group))


def best_interval(inputs: GoodputInputs, around: float, *, failures: int = 20_000,
                  seed: int = 0, points: int = 13, spread: float = 3.0) -> float:
    """The checkpoint interval the simulation finds best: goodput simulated (same failures for
    each) at `points` intervals from ``around / spread`` to ``around x spread``, a parabola in
    log(interval) fitted through them, and its vertex."""
    xs = [math.log(around) + math.log(spread) * (2 * i / (points - 1) - 1)
          for i in range(points)]
    ys = [simulate(inputs, math.exp(x), failures=failures, seed=seed) for x in xs]
    a, b, _ = _parabola(xs, ys)
    if a >= 0:  # no maximum inside: the best simulated point
        return math.exp(xs[max(range(points), key=ys.__getitem__)])
    return math.exp(-b / (2 * a))


def _parabola(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Least-squares a x^2 + b x + c (normal equations, 3 x 3)."""
    sums = [sum(x ** k for x in xs) for k in range(5)]
    rhs = [sum(y * x ** k for x, y in zip(xs, ys, strict=True)) for k in range(3)]
    matrix = [[sums[4], sums[3], sums[2]], [sums[3], sums[2], sums[1]],
              [sums[2], sums[1], sums[0]]]
    return tuple(_solve(matrix, [rhs[2], rhs[1], rhs[0]]))  # type: ignore[return-value]


def _solve(matrix: list[list[float]], rhs: list[float]) -> list[float]:
    """Gaussian elimination with partial pivoting (a 3 x 3 system)."""
    rows = [[*row, value] for row, value in zip(matrix, rhs, strict=True)]
    size = len(rows)
    for col in range(size):
        pivot = max(range(col, size), key=lambda r: abs(rows[r][col]))
        rows[col], rows[pivot] = rows[pivot], rows[col]
        for r in range(col + 1, size):
            factor = rows[r][col] / rows[col][col]
            rows[r] = [a - factor * b for a, b in zip(rows[r], rows[col], strict=True)]
    out = [0.0] * size
    for r in reversed(range(size)):
        out[r] = (rows[r][size] - sum(rows[r][c] * out[c] for c in range(r + 1, size))) / rows[r][r]
    return out


__all__ = ["best_interval", "simulate"]
