"""Launch overhead: `Estimator.fit()` of a 1-host x 2-process local job vs raw torchrun.

The same script (``probe`` below: ``meshtrain_runtime.init()`` and one barrier, so the figure is
launch cost, not training) runs as a local meshtrain job and as
``torchrun --standalone --nproc-per-node=2 probe.py``, in interleaved pairs (fit first, then
torchrun first, ...). fit() is timed in this process (the SDK already imported, as in a launcher
script); torchrun as a subprocess. Returns the wall-clock seconds of each.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

PROBE = """\
import torch.distributed as dist

import meshtrain_runtime as mr

mr.init()
dist.barrier()
"""


def _fit(source: Path, jobs: Path) -> float:
    from meshtrain import Estimator

    estimator = Estimator(
        entry_point="probe.py", source_dir=str(source), instance_type="local",
        distribution={"torch_distributed": {"enabled": True, "processes_per_host": 2}},
        jobs_dir=str(jobs),
    )
    start = time.perf_counter()
    estimator.fit(logs=False)
    return time.perf_counter() - start


def _torchrun(source: Path, env: dict[str, str]) -> float:
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone",
               "--nproc-per-node=2", str(source / "probe.py")]
    start = time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - start


def measure_launch(pairs: int, env: dict[str, str]) -> tuple[list[float], list[float]]:
    """`pairs` interleaved (fit, torchrun) timings in seconds."""
    fit_s: list[float] = []
    torchrun_s: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        source, jobs = Path(tmp) / "src", Path(tmp) / "jobs"
        source.mkdir()
        (source / "probe.py").write_text(PROBE)
        for index in range(pairs):
            if index % 2 == 0:
                fit_s.append(_fit(source, jobs))
                torchrun_s.append(_torchrun(source, env))
            else:
                torchrun_s.append(_torchrun(source, env))
                fit_s.append(_fit(source, jobs))
    return fit_s, torchrun_s
