"""Cells of the pipeline-parallel notebook: a list of ("md" | "code", source).

make_notebooks.py writes it as llama_pipeline.ipynb. It runs the training script of
``examples/llama_pipeline`` (found by ``examples_folder()``, see notebook_cells.py).
"""

from __future__ import annotations

from notebook_cells import JOB_OUTPUT

PIPELINE = [
    ("md", """
# Pipeline parallelism: a Llama in 2 stages x 2 data-parallel ranks, and one step's timeline

`pipeline_parallel_degree=2` cuts Hugging Face's `LlamaForCausalLM` (a tiny config, nothing
downloaded) into two stages by its blocks: the embedding and blocks 0-1 on the first, blocks 2-3,
the final norm and the head on the last. `hybrid_shard_degree=2` shards each stage with FSDP2
over its 2 ranks. The job runs as **2 hosts x 2 processes** on this machine:

| host | ranks | stage | data-parallel rank |
|---|---|---|---|
| algo-1 | 0, 1 | 0 (first) | 0, 1 |
| algo-2 | 2, 3 | 1 (last) | 0, 1 |

`meshtrain_runtime.forward_backward` runs torch's **1F1B** schedule over `microbatches=4`
chunks of each data-parallel rank's rows. The script records, for one step, when each rank ran
each microbatch's forward (F) and backward (B); the last plot draws them, one row per rank.
It needs `meshtrain[notebooks]` and runs on a laptop's CPU in well under a minute.
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import json
import tarfile
from pathlib import Path

import matplotlib.pyplot as plt

from meshtrain import Estimator
''' + JOB_OUTPUT + '''
SOURCE = EXAMPLES / "llama_pipeline"
script = (SOURCE / "train.py").read_text()
print(script[script.index("    losses = []"):script.index("    path = meshtrain_runtime")])
'''),
    ("md", """
## 2. Configure and run the job

The pipeline's keys sit beside SMP v2's in `parameters`. `timeline-step` asks `train.py` to
time step 4's actions (step 0 builds torch's pipeline stages) and write
`timeline-rank<r>.json` on every rank to `SM_OUTPUT_DATA_DIR` (packed into `output.tar.gz`).
"""),
    ("code", '''
STEPS, TIMELINE_STEP = 8, 4
estimator = Estimator(
    entry_point="train.py",
    source_dir=str(SOURCE),
    base_job_name="llama-pipeline-notebook",
    instance_type="local",          # "ml.p4d.24xlarge" (with a role) runs on SageMaker
    instance_count=2,
    hyperparameters={"steps": STEPS, "lr": 1e-2, "global-batch": 8,
                     "timeline-step": TIMELINE_STEP},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "pipeline_parallel_degree": 2,
            "hybrid_shard_degree": 2,
            "pipeline_schedule": "1F1B",
            "microbatches": 4,
        }}},
    },
)
estimator.fit(inputs={"train": str(EXAMPLES / "data" / "corpus")}, logs=False)
print(estimator.latest_training_job.status, "- model:", estimator.model_data)
'''),
    ("md", """
## 3. The loss curve

`forward_backward` returns the mean loss of the microbatches on every rank of a pipeline;
`global_mean` averages it over the data-parallel ranks: the global batch's loss.
"""),
    ("code", '''
losses = job_output(estimator)["train:loss"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(range(len(losses)), losses, marker="o", markersize=3)
ax.set(xlabel="step", ylabel="training loss",
       title="Llama, pp=2 x dp=2 (1F1B, 4 microbatches), 2 hosts x 2 processes")
ax.grid(alpha=0.3)
plt.show()
'''),
    ("md", """
## 4. One step, rank by rank

Each bar is one action of one microbatch (its number inside the bar); white space is a rank
waiting (the pipeline's bubble, or a transfer). Under 1F1B the first stage runs one forward
ahead (F0 F1 B0 F2 B1 ...), then alternates; the last stage alternates from the start, each
backward right after its forward. Every rank reads the same (wall) clock from one origin, so a
stage's forward starts only after the previous stage's forward of that microbatch ended, and a
backward after the next stage's backward. On this CPU the actions take milliseconds and include
FSDP's all-gathers.
"""),
    ("code", '''
timelines = [job_output(estimator, f"timeline-rank{rank}.json") for rank in range(4)]
colors = {"F": "tab:blue", "B": "tab:orange"}

fig, ax = plt.subplots(figsize=(10, 3.2))
for row, timeline in enumerate(timelines):
    for action in timeline["actions"]:
        start, width = action["start"] * 1e3, (action["end"] - action["start"]) * 1e3
        ax.barh(row, width, left=start, height=0.7, color=colors[action["kind"]],
                edgecolor="black", linewidth=0.5)
        ax.text(start + width / 2, row, f"{action['kind']}{action['microbatch']}",
                ha="center", va="center", fontsize=7)
ax.set_yticks(range(len(timelines)),
              [f"rank {t['rank']}: stage {t['pp_rank']}, dp {t['dp_rank']}" for t in timelines])
ax.invert_yaxis()
ax.set(xlabel="ms since the step began", title=f"Step {TIMELINE_STEP}: 1F1B on 2 stages")
ax.legend(handles=[plt.Rectangle((0, 0), 1, 1, color=c) for c in colors.values()],
          labels=["forward", "backward"], loc="upper left", bbox_to_anchor=(1.0, 1.0))
fig.tight_layout()
plt.show()

for timeline in timelines:
    busy = sum(a["end"] - a["start"] for a in timeline["actions"])
    order = " ".join(f"{a['kind']}{a['microbatch']}" for a in timeline["actions"])
    print(f"rank {timeline['rank']}: {order}  busy {busy / timeline['seconds']:.0%} "
          f"of {timeline['seconds'] * 1e3:.1f} ms")
'''),
    ("md", "## 5. Check the results"),
    ("code", '''
assert len(losses) == STEPS
assert losses[-1] < 0.85 * losses[0], f"the loss did not fall: {losses[0]:.3f} -> {losses[-1]:.3f}"
expected = {0: "F0 F1 B0 F2 B1 F3 B2 B3", 1: "F0 B0 F1 B1 F2 B2 F3 B3"}  # 1F1B, 2 stages
for timeline in timelines:
    order = " ".join(f"{a['kind']}{a['microbatch']}" for a in timeline["actions"])
    assert order == expected[timeline["pp_rank"]], (timeline["rank"], order)
job_dir = Path(estimator.model_data.removeprefix("file://")).parents[1]
checkpoint = job_dir / "checkpoints" / f"step_{STEPS:08d}"
assert json.loads((checkpoint / "meshtrain-checkpoint.json").read_text())["step"] == STEPS
print(f"loss {losses[0]:.3f} -> {losses[-1]:.3f}; 1F1B order on every rank; "
      f"checkpoint {checkpoint.name} complete")
'''),
]
