"""Launch overhead: `Estimator.fit()` of a 1-host x 2-process local job vs raw torchrun.

The same script (``probe`` below: ``meshtrain_runtime.init()`` and one barrier, so the figure is
launch cost, not training) runs two ways, each from a fresh interpreter started by this process:

- ``python -c 'from meshtrain import Estimator; Estimator(...).fit()'`` (a local job: the SDK's
  import, the job directory, the supervisor, torchrun and the ranks);
- ``python -m torch.distributed.run --standalone --nproc-per-node=2 probe.py``.

Each round runs fit, torchrun and a second torchrun (the null pair: torchrun against itself, the
method's floor), in that order on even rounds and reversed on odd ones. For each run: wall
seconds, and CPU seconds of the whole process tree (``RUSAGE_CHILDREN`` of this process; the fit
side reaps its finished supervisor before it exits, so the supervisor's tree is counted too).
"""

from __future__ import annotations

import resource
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

# Run as `python -c FIT source_dir jobs_dir`. After fit() the job's supervisor (a child of this
# interpreter, in a session of its own) has exited; reaping it here adds its CPU time, and that
# of the torchrun and ranks it waited for, to what this interpreter's parent measures.
FIT = """\
import os, sys
from meshtrain import Estimator

Estimator(entry_point="probe.py", source_dir=sys.argv[1], instance_type="local",
          distribution={"torch_distributed": {"enabled": True, "processes_per_host": 2}},
          jobs_dir=sys.argv[2]).fit(logs=False)
while True:
    try:
        os.waitpid(-1, 0)
    except ChildProcessError:
        break
"""


def _children_cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_CHILDREN)
    return usage.ru_utime + usage.ru_stime


def _timed(command: list[str], env: dict[str, str]) -> tuple[float, float]:
    """(wall seconds, CPU seconds of its process tree) of one fresh process."""
    cpu, start = _children_cpu(), time.perf_counter()
    subprocess.run(command, env=env, check=True, capture_output=True, timeout=300)
    return time.perf_counter() - start, _children_cpu() - cpu


def measure_launch(pairs: int, env: dict[str, str]) -> dict[str, list[float]]:
    """`pairs` interleaved rounds; wall and CPU seconds of fit, torchrun and the null torchrun."""
    out: dict[str, list[float]] = {f"{side}_{kind}": [] for side in ("fit", "torchrun", "null")
                                   for kind in ("s", "cpu_s")}
    with tempfile.TemporaryDirectory() as tmp:
        source, jobs = Path(tmp) / "src", Path(tmp) / "jobs"
        source.mkdir()
        (source / "probe.py").write_text(PROBE)
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone",
                    "--nproc-per-node=2", str(source / "probe.py")]
        commands = {"fit": [sys.executable, "-c", FIT, str(source), str(jobs)],
                    "torchrun": torchrun, "null": torchrun}
        for index in range(pairs):
            order = list(commands) if index % 2 == 0 else list(reversed(commands))
            for side in order:
                wall, cpu = _timed(commands[side], env)
                out[f"{side}_s"].append(wall)
                out[f"{side}_cpu_s"].append(cpu)
    return out
