"""Cells of the fault-tolerance notebook: a list of ("md" | "code", source).

make_notebooks.py writes it as fault_tolerance.ipynb. It runs ``examples/fault_tolerance``'s
train.py and uses its launch.py's helpers (found with FIND_EXAMPLES).
"""

from __future__ import annotations

from notebook_cells import FIND_EXAMPLES

FAULT_TOLERANCE = [
    ("md", """
# Fault tolerance: a rank dies, the job goes on

With `torch_distributed.fault_tolerance: {"replica_groups": N}` the replicas of hybrid sharding
become **replica groups** that fail alone: when a rank dies, its group is restarted (3 times
per group by default) while the other groups keep stepping; the restarted group copies the model
and optimizer from a live peer and joins again. The training script needs no change.

This notebook runs `examples/fault_tolerance/train.py` (a plain loop) as 2 hosts x 2 processes,
each host a replica group, kills one rank of group 1 after 10 steps, and looks at what the job
recorded. It needs Linux x86_64 and `meshtrain[ft]` (torchft), and matplotlib.
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import importlib.util
from pathlib import Path

import matplotlib.pyplot as plt
''' + FIND_EXAMPLES + '''
spec = importlib.util.spec_from_file_location(
    "ft_launch", EXAMPLES / "fault_tolerance" / "launch.py")
ft = importlib.util.module_from_spec(spec)
spec.loader.exec_module(ft)
'''),
    ("md", """
## 2. The job

The docs' lead example: `fault_tolerance: {"replica_groups": 2}` and nothing else. Each host
(its 2 ranks shard the model) is one replica group.
"""),
    ("code", '''
estimator = ft.estimator(steps=160, step_seconds=0.2)
print(estimator.distribution)
job = estimator.fit(wait=False)
'''),
    ("md", """
## 3. Kill a rank of group 1

Once group 1 has committed 10 steps, SIGKILL its rank 1 (as a crashed process or a lost GPU
would end it), then wait for the job.
"""),
    ("code", '''
killed_at = ft.kill_a_rank(job, kill_at=10)
job.wait(logs=False)
'''),
    ("md", """
## 4. What the job says

The job log's own lines (torchft's are in `meshtrain logs JOB --debug`), then
`describe()["FaultTolerance"]`.
"""),
    ("code", '''
ft.report(job, killed_at)
figures = job.describe()["FaultTolerance"]
assert job.describe()["TrainingJobStatus"] == "Completed"
assert figures["Recoveries"][0]["Rejoined"], "group 1 did not come back before the job ended"
'''),
    ("md", """
## 5. Steps per group over time

Group 0's committed steps go on through the failure; group 1's stop at the kill and, once it
has healed, rejoin group 0's line.
"""),
    ("code", '''
records = ft.step_records(job)
start = min(t for points in records.values() for t, _ in points)
for group, points in sorted(records.items()):
    plt.plot([t - start for t, _ in points], [s for _, s in points], ".", markersize=3,
             label=f"replica group {group}")
plt.axvline(killed_at - start, color="red", linestyle="--", label="rank of group 1 killed")
plt.xlabel("seconds")
plt.ylabel("committed steps")
plt.legend()
plt.show()
'''),
]
