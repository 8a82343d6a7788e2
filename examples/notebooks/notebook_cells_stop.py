"""Cells of the stop-and-resume notebook: a list of ("md" | "code", source).

make_notebooks.py writes it as stop_and_resume.ipynb. It runs the training script of
``examples/stop_and_resume`` (at ``Path.cwd().parent``, the notebook's folder being the kernel's).
"""

from __future__ import annotations

from notebook_cells import JOB_OUTPUT

STOP = [
    ("md", """
# Stop a job, save on the way out, resume it in a new job

Jobs are stopped: by you (`job.stop()`, Ctrl-C in `fit()`), by `max_run`, by a reclaimed spot
instance. Each rank then gets SIGTERM and a grace period (`torch_distributed.stop_grace_seconds`,
120 s by default). A script that asks `meshtrain_runtime.stop_requested()` once per step gets
`True` on **every rank at the same step**, saves that step's checkpoint and exits; the job is
`Stopped`, and a new job pointed at the same `checkpoint_local_path` goes on from there.

This notebook runs `examples/stop_and_resume/train.py` (a tiny language model, 2 hosts x 2
processes, hybrid sharding) three times:

| job | what happens |
|---|---|
| uninterrupted | steps 0-9, the reference |
| stopped | `fit(wait=False)`, then `job.stop()` once step 2 is logged |
| resumed | a new job, same `checkpoint_local_path`: from the saved step + 1 to step 9 |

The data of every step is the same global batch in every job, so stopped + resumed should give
the uninterrupted run's losses. (`launch.py` in the example also restarts a job whose rank
crashes, with `torch_distributed.max_restarts=1`.)
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import json
import re
import shutil
import tarfile
import tempfile
import time
from pathlib import Path

import matplotlib.pyplot as plt

from meshtrain import Estimator
''' + JOB_OUTPUT + '''
SOURCE = EXAMPLES / "stop_and_resume"
script = (SOURCE / "train.py").read_text()
print(script[script.index("    start = resume"):script.index("    export_full_state_dict")])
'''),
    ("md", """
## 2. One Estimator per job

The same job each time; only the name, the checkpoint folder and the per-step sleep (which
gives us time to stop the second job mid-training) change.
"""),
    ("code", '''
def estimator(name, checkpoints=None, step_seconds=0.0):
    return Estimator(
        entry_point="train.py", source_dir=str(SOURCE), instance_type="local",
        instance_count=2, base_job_name=f"stop-resume-{name}",
        hyperparameters={"steps": 10, "save-every": 2, "step-seconds": step_seconds},
        checkpoint_local_path=str(checkpoints) if checkpoints else None,
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": 2},
            "smdistributed": {"modelparallel": {"enabled": True,
                                                "parameters": {"hybrid_shard_degree": 2}}},
        },
    )


checkpoints = Path(tempfile.mkdtemp(prefix="meshtrain-ckpt-"))  # removed by the last cell
print("checkpoint folder of the stopped and resumed jobs:", checkpoints)
'''),
    ("md", "## 3. The uninterrupted reference"),
    ("code", '''
uninterrupted = estimator("uninterrupted")
uninterrupted.fit(logs=False)
reference = job_output(uninterrupted)
print(uninterrupted.latest_training_job.status, "final loss", reference["train:loss"][-1])
'''),
    ("md", """
## 4. Start a job, stop it mid-training

`fit(wait=False)` returns the job at once. We watch its log for step 2's metric line, then
call `job.stop()`, which returns once the job has ended.
"""),
    ("code", '''
stopping = estimator("stopped", checkpoints, step_seconds=1.0)
job = stopping.fit(wait=False)
deadline = time.monotonic() + 600
while not any(re.search(r"train:loss=\\S+ step=2\\b", line) for line in job.log_lines()):
    assert job.status not in ("Completed", "Failed", "Stopped"), job.status
    assert time.monotonic() < deadline, "step 2 never came"
    time.sleep(0.2)
job.stop()
description = job.describe()
print(description["TrainingJobStatus"], "-", description["FailureReason"])
print("\\n".join(line for line in job.log_lines() if "stop requested" in line))
stopped = job_output(stopping)
saved = checkpoints / f"step_{stopped['stopped_at']:08d}"
print(saved.name, sorted(p.name for p in saved.iterdir()))
'''),
    ("md", """
## 5. A new job resumes from the saved step

`train.py` asks `latest_checkpoint()`, the newest step folder whose marker file
`meshtrain-checkpoint.json` exists (it is written once every rank's shard is on disk), and
loads the model and optimizer states from it.
"""),
    ("code", '''
resuming = estimator("resumed", checkpoints)
resuming.fit(logs=False)
resumed = job_output(resuming)
print("resumed from step", resumed["resumed_from"], "; trained steps", resumed["steps"])
'''),
    ("md", "## 6. The loss curves"),
    ("code", '''
expected = dict(zip(reference["steps"], reference["train:loss"], strict=True))
gaps = [abs(loss - expected[step])
        for job_losses in (stopped, resumed)
        for step, loss in zip(job_losses["steps"], job_losses["train:loss"], strict=True)]

fig, ax = plt.subplots(figsize=(8, 3.8))
ax.plot(reference["steps"], reference["train:loss"], color="lightgray", linewidth=6,
        label="uninterrupted")
ax.plot(stopped["steps"], stopped["train:loss"], "o-", label="stopped job")
ax.plot(resumed["steps"], resumed["train:loss"], "s-", label="resumed job")
ax.axvline(stopped["stopped_at"] + 0.5, color="black", linestyle="--", linewidth=1)
ax.text(stopped["stopped_at"] + 0.6, max(reference["train:loss"]),
        f"stop: step {stopped['stopped_at']} saved", va="top")
ax.set(xlabel="step", ylabel="training loss",
       title=f"Stopped and resumed vs uninterrupted (largest gap {max(gaps):.1e})")
ax.grid(alpha=0.3)
ax.legend()
plt.show()
'''),
    ("md", "## 7. Check the results"),
    ("code", '''
assert description["TrainingJobStatus"] == "Stopped"
assert description["FailureReason"].startswith("StopRequested")
assert stopped["steps"] == list(range(stopped["stopped_at"] + 1)) and stopped["stopped_at"] < 9
assert (saved / "meshtrain-checkpoint.json").exists()  # the saved checkpoint is complete
assert resumed["resumed_from"] == stopped["stopped_at"]
assert resumed["steps"] == list(range(stopped["stopped_at"] + 1, 10))
assert max(gaps) <= 1e-5, gaps  # the same seed and data: the uninterrupted run's losses
assert resumed["train:loss"][-1] < 0.8 * reference["train:loss"][0], "the loss did not fall"
print(f"stopped after step {stopped['stopped_at']}, resumed at {resumed['steps'][0]}; "
      f"largest gap to the uninterrupted run {max(gaps):.1e}")
'''),
    ("md", "## 8. Clean up: the checkpoints were for this demo only"),
    ("code", '''
shutil.rmtree(checkpoints)
'''),
]
