"""Cells of the quickstart and resume notebooks: lists of ("md" | "code", source).

make_notebooks.py writes them as .ipynb files. Jupyter starts the kernel in the notebook's
folder, so in a clone the examples are at ``Path.cwd().parent``; a notebook copied elsewhere
finds them with ``examples_folder()`` (FIND_EXAMPLES) instead of failing on a relative path.
"""

from __future__ import annotations

FIND_EXAMPLES = '''

def examples_folder():
    """meshtrain's examples/: beside this notebook's folder in a clone, else above the working
    directory, in the clone meshtrain is installed from (pip install -e), or $MESHTRAIN_EXAMPLES:
    a notebook copied elsewhere still finds the scripts it runs."""
    import os

    import meshtrain

    here = Path.cwd().resolve()
    given = os.environ.get("MESHTRAIN_EXAMPLES")
    candidates = [Path(given)] if given else []
    candidates += [here.parent, *(folder / "examples" for folder in (here, *here.parents)),
                   Path(meshtrain.__file__).resolve().parents[2] / "examples"]
    for folder in candidates:
        if (folder / "quickstart" / "train.py").is_file():
            return folder
    raise FileNotFoundError(
        f"meshtrain's examples/ folder is neither beside nor above {here}, nor in the clone "
        "meshtrain is installed from: set MESHTRAIN_EXAMPLES=/path/to/meshtrain/examples")


EXAMPLES = examples_folder()
'''

JOB_OUTPUT = FIND_EXAMPLES + '''


def job_output(estimator, name="losses.json"):
    """A JSON file the job wrote to SM_OUTPUT_DATA_DIR (output.tar.gz, beside model.tar.gz)."""
    output = Path(estimator.model_data.removeprefix("file://")).with_name("output.tar.gz")
    with tarfile.open(output) as tar:
        return json.load(tar.extractfile(name))
'''

QUICKSTART = [
    ("md", """
# Quickstart: a hybrid-sharded training job on local processes

This notebook trains a tiny transformer language model with meshtrain's `Estimator`, the
SageMaker Python SDK's arguments on an open runtime. The job runs as **2 hosts x 2 processes**
on this machine, each host in its own `/opt/ml` tree as a SageMaker training host sees it, and
`meshtrain_runtime.transform(model)` applies **hybrid sharding** (FSDP2): parameters are
sharded over the 2 processes of a host and replicated across the hosts.

Steps: set up, look at the training script, configure the Estimator, train, plot the loss.
It needs `meshtrain[runtime]` (torch) and matplotlib, and runs on a laptop's CPU in well under
a minute.
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import json
import os
import tarfile
from pathlib import Path

import matplotlib.pyplot as plt

from meshtrain import Estimator
''' + JOB_OUTPUT + '''
print("jobs are written under", os.environ.get("MESHTRAIN_HOME", "~/.meshtrain"), "/ jobs")
'''),
    ("md", """
## 2. The training script

`examples/quickstart/train.py` runs on every rank under torchrun. The lines that matter:
`meshtrain_runtime.init()` reads the distribution the Estimator sent,
`meshtrain_runtime.data.loader("train", ...)` reads the `train` channel's text (UTF-8 bytes,
packed into samples of `seq_len + 1` tokens) and hands each data-parallel rank its rows of every
global batch, `transform(model)` shards the model, `log_metric` prints SageMaker metric lines,
and rank 0 writes the model to `SM_MODEL_DIR` and the losses to `SM_OUTPUT_DATA_DIR`.
"""),
    ("code", '''
script = (EXAMPLES / "quickstart" / "train.py").read_text()
print(script[script.index("def main"):])
'''),
    ("md", """
## 3. Configure the job

`distribution` takes SMP v2's keys. `processes_per_host` is a meshtrain extension for CPU
hosts (on SageMaker every GPU gets one process). `hybrid_shard_degree=2` shards within a host.
"""),
    ("code", '''
estimator = Estimator(
    entry_point="train.py",
    source_dir=str(EXAMPLES / "quickstart"),
    base_job_name="quickstart-notebook",
    instance_type="local",          # "ml.p4d.24xlarge" (with a role) runs on SageMaker
    instance_count=2,
    hyperparameters={"steps": 20, "lr": 3e-3},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 2,
        }}},
    },
)
'''),
    ("md", """
## 4. Train

`fit()` validates everything, starts both hosts and streams their merged logs (each line
prefixed with its host and rank). It raises `meshtrain.JobFailedError` if a rank fails. The
`train` channel is the repository's small generated corpus (`examples/data/corpus/train.jsonl`);
on SageMaker it would be an S3 URI.
"""),
    ("code", '''
estimator.fit(inputs={"train": str(EXAMPLES / "data" / "corpus")})
print("model:", estimator.model_data)
'''),
    ("md", """
## 5. The loss curve

The script wrote `losses.json` (the global batch's loss at every step) to `SM_OUTPUT_DATA_DIR`;
the job packed it into `output.tar.gz` next to `model.tar.gz`, as SageMaker does.
"""),
    ("code", '''
losses = job_output(estimator)["train:loss"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(len(losses)), losses, marker="o", markersize=3)
ax.set(xlabel="step", ylabel="training loss",
       title="Quickstart: 2 hosts x 2 processes, hybrid_shard_degree=2")
ax.grid(alpha=0.3)
plt.show()
'''),
    ("md", "## 6. Check the results"),
    ("code", '''
assert len(losses) == 20
assert losses[-1] < 0.8 * losses[0], f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
with tarfile.open(estimator.model_data.removeprefix("file://")) as tar:
    assert "model.pt" in tar.getnames()
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; model.tar.gz holds model.pt")
'''),
    ("md", """
## Next

- Larger layouts: `examples/llama_tp_hsdp` (tensor parallelism), `examples/mixtral_ep`
  (expert parallelism), `examples/activation_checkpointing`.
- The same job on SageMaker: `sagemaker.ipynb`. Will it fit on GPUs? `planning.ipynb`.
"""),
]

RESUME = [
    ("md", """
# Checkpoint on one layout, resume on another

A long job is rarely finished on the cluster it started on: instances change, a job is
restarted with more (or fewer) hosts, a tensor-parallel run is continued without tensor
parallelism. meshtrain saves **sharded** checkpoints with `torch.distributed.checkpoint`, which
records global shapes, so a checkpoint loads into any layout.

This notebook runs the training script of `examples/resume_other_layout` (a tiny Hugging Face
Llama) three times, every job pointing `checkpoint_local_path` at its checkpoint directory:

| job | layout | steps |
|---|---|---|
| 1 | 2 hosts x 2 processes, `tensor_parallel_degree=2` (hosts are replicas) | 0-5, saves at 6 |
| 2 | 1 host x 2 processes, full sharding | resumes at 6, trains 6-11 |
| reference | 1 process | 0-11 without stopping |

The script keeps the global batch the same on every layout, so jobs 1 + 2 should retrace the
reference.
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import json
import shutil
import tarfile
import tempfile
from pathlib import Path

import matplotlib.pyplot as plt

from meshtrain import Estimator
''' + JOB_OUTPUT + '''
SOURCE = EXAMPLES / "resume_other_layout"
script = (SOURCE / "train.py").read_text()
print(script[script.index("    start, resumed_from"):script.index("    per_rank")])
'''),
    ("md", """
## 2. One function per job

Each job trains up to global step `steps`. `train.py` calls `latest_checkpoint()` in
`SM_CHECKPOINT_DIR` (the Estimator's `checkpoint_local_path`) and, when it finds one, loads
model and optimizer into its own layout and continues from the saved step.
"""),
    ("code", '''
def run_job(name, hosts, processes, parameters, steps, checkpoints):
    estimator = Estimator(
        entry_point="train.py", source_dir=str(SOURCE), instance_type="local",
        instance_count=hosts, base_job_name=name,
        hyperparameters={"steps": steps, "save-every": 6},
        checkpoint_local_path=str(checkpoints),
        distribution={
            "torch_distributed": {"enabled": True, "processes_per_host": processes},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}},
        },
    )
    estimator.fit()
    return job_output(estimator)


scratch = Path(tempfile.mkdtemp(prefix="meshtrain-ckpt-"))  # removed by the last cell
shared = scratch / "shared"
print("shared checkpoint directory:", shared)
'''),
    ("md", "## 3. Job 1: tensor parallelism on 2 hosts, stop after 6 steps"),
    ("code", '''
job1 = run_job("resume-tp", 2, 2, {"tensor_parallel_degree": 2, "hybrid_shard_degree": 1},
               steps=6, checkpoints=shared)
print(job1["layout"], sorted(p.name for p in shared.iterdir()))
'''),
    ("md", "## 4. Job 2: full sharding on 1 host, resume from step 6"),
    ("code", '''
job2 = run_job("resume-fsdp", 1, 2, {"hybrid_shard_degree": 2}, steps=12, checkpoints=shared)
print(job2["layout"], "resumed from step", job2["resumed_from"])
'''),
    ("md", "## 5. Reference: one process, 12 steps without stopping"),
    ("code", '''
reference = run_job("resume-reference", 1, 1, {}, steps=12,
                    checkpoints=scratch / "reference")
'''),
    ("md", """
## 6. The loss curves

Left: the two jobs over the uninterrupted reference. Right: how far each step's loss is from
the reference (float32 arithmetic in another order on each layout; it grows slowly with the
steps, as any two runs of the same model on different layouts do).
"""),
    ("code", '''
steps = job1["steps"] + job2["steps"]
resumed = job1["train:loss"] + job2["train:loss"]
ref = dict(zip(reference["steps"], reference["train:loss"], strict=True))
gaps = [abs(loss - ref[step]) for step, loss in zip(steps, resumed, strict=True)]

fig, (left, right) = plt.subplots(1, 2, figsize=(11, 3.8))
left.plot(reference["steps"], reference["train:loss"], color="lightgray", linewidth=5,
          label="reference: 1 process, no stop")
left.plot(job1["steps"], job1["train:loss"], "o-", label=f"job 1: {job1['layout']}")
left.plot(job2["steps"], job2["train:loss"], "s-", label=f"job 2: {job2['layout']}")
left.axvline(job2["resumed_from"] - 0.5, color="black", linestyle="--", linewidth=1)
left.text(job2["resumed_from"] - 0.4, max(resumed), "resume on\\nanother layout", va="top")
left.set(xlabel="step", ylabel="training loss", title="Loss across the layout change")
left.legend(fontsize=8)
right.semilogy(steps, [max(g, 1e-9) for g in gaps], "o-")
right.set(xlabel="step", ylabel="|loss - reference|", title="Distance from the reference")
for ax in (left, right):
    ax.grid(alpha=0.3)
plt.tight_layout()
plt.show()
'''),
    ("md", "## 7. Check the results"),
    ("code", '''
assert job1["steps"] == list(range(6)) and job2["steps"] == list(range(6, 12))
assert job2["resumed_from"] == 6
# Job 2 continued job 1's run: its loss stayed on the reference curve, not back at the start.
# 1e-4: twelve AdamW steps at lr 1e-2 in float32, summed in another order per layout
# (measured about 3e-5 at step 11; the checkpoint tests assert 1e-5 after two steps).
assert max(gaps) < 1e-4, gaps
assert resumed[-1] < 0.6 * resumed[0], "the loss did not go down"
print(f"loss {resumed[0]:.3f} -> {resumed[-1]:.3f}; largest gap to the reference {max(gaps):.1e}")
'''),
    ("md", "## 8. Clean up: the checkpoints were for this demo only"),
    ("code", '''
shutil.rmtree(scratch)
'''),
]
