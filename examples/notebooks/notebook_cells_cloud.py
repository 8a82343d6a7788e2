"""Cells of the notebooks that plan and launch GPU runs: planning and SageMaker."""

from __future__ import annotations

from notebook_cells import FIND_EXAMPLES, JOB_OUTPUT

PLANNING = [
    ("md", """
# Planning a 7B and a 70B run: will it fit, and which layout?

Before paying for GPUs, `meshtrain.plan` estimates what every GPU holds (model states,
activations, temporary buffers) and sends per step, for every layout meshtrain's runtime can
run on a cluster, and ranks them. It is pure Python: no torch, no GPU, no AWS call.

This notebook plans Llama 2 7B on one `ml.p4d.24xlarge` (8 x A100 40 GB) and Llama 2 70B on
four, draws the memory breakdown of the candidate layouts, finds how many instances the 70B
run needs, and shows the Estimator's pre-flight refusing a layout that cannot fit.
"""),
    ("md", "## 1. Setup"),
    ("code", '''
from pathlib import Path

import matplotlib.pyplot as plt

from meshtrain import ConfigError, Estimator
from meshtrain.plan import Training, build_cluster, plan_layouts, resolve_model
from meshtrain.plan.cli import plan_main
from meshtrain.plan.layouts import smallest_fitting_count
from meshtrain.plan.report import distribution_for, plan_to_dict
''' + FIND_EXAMPLES + '''
INSTANCE = "ml.p4d.24xlarge"
TRAINING = Training(seq_len=4096, micro_batch=1, precision="bf16")   # torch's default AdamW
GIB = 2**30


def plan(model, count):
    """The ranked plan as JSON-ready data (the same fields as `meshtrain plan --json`)."""
    cluster = build_cluster(instance_type=INSTANCE, instance_count=count)
    return plan_to_dict(plan_layouts(resolve_model(model), cluster, TRAINING), top=6)
'''),
    ("md", """
## 2. The command line

`meshtrain plan` prints the same plan as a table (`--json` for programs).
"""),
    ("code", '''
exit_status = plan_main(["--model", "llama2-7b", "--instance-type", INSTANCE,
                         "--instance-count", "1", "--top", "5"])
'''),
    ("md", """
## 3. Memory per GPU of the best 7B layouts

Each bar is one layout's peak: model states (bf16 parameters, fp32 gradients and Adam's
states, sharded), the activations kept for backward and the temporary buffers of backward
(gathered parameters, unsharded gradients). The dashed line is what a 40 GB A100 leaves after
the reserve for the CUDA context, NCCL and fragmentation.
"""),
    ("code", '''
PARTS = [("parameters", "parameters"), ("gradients", "gradients"),
         ("optimizer_states", "optimizer states"), ("activations", "activations"),
         ("temporary_buffers", "temporary buffers")]


STAGES = {"full_shard": "zero3", "hybrid_shard": "zero3", "shard_grad_op": "zero2",
          "_hybrid_shard_zero2": "zero2", "no_shard": "ddp"}


def short(candidate):
    """A two- or three-line label: sharding (and ZeRO stage), TP, checkpointing."""
    d, layout = candidate["degrees"], candidate["layout"]
    text = f"shard {d['hybrid_shard_degree']}"
    if d["replicate_degree"] > 1:
        text += f" x rep {d['replicate_degree']}"
    text += f" {STAGES[d['sharding_strategy']]}"
    if d["tensor_parallel_degree"] > 1:
        text += f"\\ntp {d['tensor_parallel_degree']}"
        text += "+sp" if layout.get("sequence_parallel") else ""
    if layout.get("activation_checkpointing"):
        text += "\\nckpt" + ("+offload" if layout.get("activation_offloading") else "")
    return text


def memory_chart(data, ax, title):
    """Stacked memory parts per candidate, its peak, and the usable GPU memory."""
    candidates = data["candidates"]
    x = list(range(len(candidates)))
    bottom = [0.0] * len(candidates)
    for key, name in PARTS:
        values = [c["memory_bytes"][key] / GIB for c in candidates]
        ax.bar(x, values, bottom=bottom, label=name)
        bottom = [b + v for b, v in zip(bottom, values, strict=True)]
    peaks = [c["memory_bytes"]["peak"] / GIB for c in candidates]
    ax.scatter(x, peaks, marker="_", s=800, linewidths=2, color="black", zorder=3,
               label="peak (with the optimizer step's buffer)")
    capacity = data["cluster"]["capacity_bytes"] / GIB
    ax.axhline(capacity, color="red", linestyle="--", label="usable GPU memory")
    ax.set(ylabel="GiB per GPU", title=title, ylim=(0, 1.1 * max(*peaks, capacity)))
    ax.set_xticks(x, [short(c) for c in candidates], fontsize=8)
    ax.grid(axis="y", alpha=0.3)


plan_7b = plan("llama2-7b", 1)
fig, ax = plt.subplots(figsize=(10, 4))
memory_chart(plan_7b, ax, "Llama 2 7B on 1 x ml.p4d.24xlarge: the six best layouts")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()
print("recommended:", plan_7b["recommendation"]["layout"])
print(plan_7b["recommendation"]["reasoning"])
'''),
    ("md", """
The peak is model states plus the larger of (activations + temporary buffers) during backward
and the optimizer step's buffer (torch's foreach AdamW allocates a float32 copy of the local
parameters), which is why a marker can sit above its bar.

## 4. Llama 2 70B on four p4d.24xlarge
"""),
    ("code", '''
plan_70b = plan("llama2-70b", 4)
print("layouts that fit:", plan_70b["num_fitting"], "of", plan_70b["num_candidates"])
states = plan_70b["model_state_bytes_per_gpu"]
fig, (left, right) = plt.subplots(1, 2, figsize=(13, 4), gridspec_kw={"width_ratios": [1, 2.2]})
stages = ["ddp", "zero1", "zero2", "zero3"]
left.bar(stages, [states[s] / GIB for s in stages], color="tab:blue")
left.axhline(plan_70b["cluster"]["capacity_bytes"] / GIB, color="red", linestyle="--",
             label="usable GPU memory")
left.legend(fontsize=8)
left.set(yscale="log", ylabel="GiB per GPU", title="70B model states over 32 GPUs")
memory_chart(plan_70b, right, "70B on 4 x p4d: the closest layouts do not fit")
right.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
plt.tight_layout()
plt.show()
'''),
    ("md", """
Even fully sharded over 32 GPUs, 70 billion parameters at 16 bytes each are 32 GiB per GPU
before any activation. How many instances does it take?
"""),
    ("code", '''
count, bigger = smallest_fitting_count(
    resolve_model("llama2-70b"), TRAINING,
    lambda n: build_cluster(instance_type=INSTANCE, instance_count=n), above=4)
plan_70b_fit = plan_to_dict(bigger, top=6)
best = plan_70b_fit["recommendation"]
print(f"{count} x {INSTANCE}:", best["layout"])
fig, ax = plt.subplots(figsize=(10, 4))
memory_chart(plan_70b_fit, ax, f"Llama 2 70B on {count} x ml.p4d.24xlarge")
ax.legend(fontsize=8, loc="upper left", bbox_to_anchor=(1.01, 1))
plt.show()
'''),
    ("md", """
## 5. Pre-flight in the Estimator

With `plan_model`, `fit()` runs the same estimate before launching and refuses a layout that
cannot fit, naming one that would. `check_fits()` is that step on its own (no AWS request).
"""),
    ("code", '''
def estimator(count, distribution):
    """The Estimator of the 70B run (the Llama example's script); nothing is launched."""
    return Estimator(entry_point="train.py", source_dir=str(EXAMPLES / "llama_tp_hsdp"),
                     instance_type=INSTANCE, instance_count=count, distribution=distribution,
                     plan_model="llama2-70b")


naive = {"torch_distributed": {"enabled": True},
         "smdistributed": {"modelparallel": {"enabled": True,
                                             "parameters": {"hybrid_shard_degree": 32}}}}
try:
    estimator(4, naive).check_fits()
    refused = None
except ConfigError as error:
    refused = str(error)
    print(refused)
estimator(count, distribution_for(bigger.best)).check_fits()   # the recommendation passes
'''),
    ("md", "## 6. Check the results"),
    ("code", '''
rec_7b = plan_7b["recommendation"]
assert rec_7b["fits"] and rec_7b["memory_bytes"]["peak"] <= plan_7b["cluster"]["capacity_bytes"]
assert plan_70b["num_fitting"] == 0 and plan_70b["recommendation"] is None
assert count > 4 and best["fits"]
assert best["memory_bytes"]["peak"] <= plan_70b_fit["cluster"]["capacity_bytes"]
assert refused is not None and "does not fit" in refused
print(f"7B: {rec_7b['layout']} on 1 instance; 70B: {best['layout']} on {count} instances")
'''),
]

SAGEMAKER = [
    ("md", """
# Launching on Amazon SageMaker

meshtrain's `Estimator` sends the `CreateTrainingJob` request the SageMaker Python SDK's
`PyTorch` estimator sends for the same arguments, so moving from a local job to SageMaker
changes the instance type and adds a role and an image. This notebook

1. runs the example's training script as a local job first (the same habit as SageMaker's local
   mode) and plots its loss;
2. launches the same script on SageMaker (`ml.g5.12xlarge`, 2 instances, hybrid sharding),
   with a metric definition for its loss lines;
3. follows the job and reads back where the model goes.

**AWS access**: boto3's usual chain (profile, SSO, environment, instance role) and region.
`AWS_ENDPOINT_URL` sends every request elsewhere: **leave it unset for real AWS**. meshtrain's
tests set it to a local moto server, which accepts the request and marks the job completed at
once without running anything: the checks at the end read back what the request sent (the
hyperparameters, the image, the instances, the uploaded code), not the job's status. Also set
`SAGEMAKER_ROLE` (an IAM role SageMaker can assume) and `MESHTRAIN_IMAGE_URI` (meshtrain's image
from `containers/`, pushed to your account's ECR, or an AWS PyTorch training image).
"""),
    ("md", "## 1. Setup"),
    ("code", '''
import io
import json
import os
import tarfile
from pathlib import Path

import boto3
import matplotlib.pyplot as plt

from meshtrain import Estimator
from meshtrain.backends.sagemaker.metrics import metric_definitions
''' + JOB_OUTPUT + '''
endpoint = os.environ.get("AWS_ENDPOINT_URL")   # unset for real AWS
role = os.environ["SAGEMAKER_ROLE"]         # an IAM role SageMaker can assume
image = os.environ["MESHTRAIN_IMAGE_URI"]   # meshtrain's image in your ECR, or an AWS PyTorch one
region = boto3.session.Session().region_name
print("AWS:", endpoint or "real AWS", "| region:", region, "| role:", role)
SOURCE = EXAMPLES / "sagemaker"
'''),
    ("md", """
## 2. Try it locally

Two processes on one local host, fully sharded, a few steps: if the script has a bug, it shows
here in seconds rather than after instances have started.
"""),
    ("code", '''
local = Estimator(
    entry_point="train.py", source_dir=str(SOURCE), base_job_name="sagemaker-notebook-local",
    instance_type="local", instance_count=1,
    hyperparameters={"steps": 12},
    distribution={"torch_distributed": {"enabled": True, "processes_per_host": 2},
                  "smdistributed": {"modelparallel": {"enabled": True,
                                                      "parameters": {"hybrid_shard_degree": 2}}}},
)
local.fit()
local_losses = job_output(local)["train:loss"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(local_losses, marker="o", markersize=3)
ax.set(xlabel="step", ylabel="training loss", title="Local try-out: 1 host x 2 processes")
ax.grid(alpha=0.3)
plt.show()
'''),
    ("md", """
## 3. Launch on SageMaker

The same script and distribution keys; one process per GPU (4 on a `ml.g5.12xlarge`), so
`hybrid_shard_degree=4` shards within each instance and replicates across the two.
`metric_definitions("train:loss")` makes SageMaker record the script's
`[meshtrain metric] train:loss=...` lines as the metric `train:loss`.
"""),
    ("code", '''
estimator = Estimator(
    entry_point="train.py", source_dir=str(SOURCE),
    role=role, image_uri=image,
    instance_type="ml.g5.12xlarge", instance_count=2,
    hyperparameters={"steps": 12},
    distribution={"torch_distributed": {"enabled": True},
                  "smdistributed": {"modelparallel": {"enabled": True,
                                                      "parameters": {"hybrid_shard_degree": 4}}}},
    metric_definitions=metric_definitions("train:loss"),
    base_job_name="meshtrain-notebook",
)
job = estimator.fit(wait=False)
description = job.describe()
print(job.name, description["TrainingJobStatus"])
print("instances:", description["ResourceConfig"])
print("code:", description["HyperParameters"]["sagemaker_submit_directory"])
'''),
    ("md", """
## 4. Follow the job

`wait()` prints the job's status changes and both hosts' CloudWatch logs in time order until it
ends (Ctrl-C stops waiting, not the job; `job.stop()` stops it). On real AWS this is where the
training lines appear; the metric `train:loss` is then in the SageMaker console and in
CloudWatch (namespace `/aws/sagemaker/TrainingJobs`).
"""),
    ("code", '''
job.wait()
print("status:", job.status)
print("model:", estimator.model_data)
'''),
    ("md", """
## 5. Check the results

What SageMaker received, read back from `DescribeTrainingJob`: the image, the instances, the
hyperparameters with the distribution as the SageMaker Python SDK encodes it (JSON-encoded
values), and the code archive uploaded to S3 with the script in it. (A job's status and model
path say little here: moto marks every job completed and derives the path from the request.)
"""),
    ("code", '''
assert local_losses[-1] < 0.8 * local_losses[0], "the local try-out did not learn"
assert description["AlgorithmSpecification"]["TrainingImage"] == image
assert description["RoleArn"] == role
assert description["ResourceConfig"]["InstanceType"] == "ml.g5.12xlarge"
assert description["ResourceConfig"]["InstanceCount"] == 2
sent = description["HyperParameters"]
assert sent["steps"] == "12"
assert sent["sagemaker_program"] == '"train.py"'
assert sent["sagemaker_instance_type"] == '"ml.g5.12xlarge"'
assert json.loads(sent["sagemaker_job_name"]) == job.name
assert sent["sagemaker_torch_distributed_enabled"] == "true"
assert sent["sagemaker_distributed_dataparallel_enabled"] == "false"
assert json.loads(sent["mp_parameters"]) == {"hybrid_shard_degree": 4}
bucket, key = json.loads(sent["sagemaker_submit_directory"]).removeprefix("s3://").split("/", 1)
archive = boto3.client("s3").get_object(Bucket=bucket, Key=key)["Body"].read()
with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
    assert "train.py" in tar.getnames()
print(f"local loss {local_losses[0]:.3f} -> {local_losses[-1]:.3f}; job {job.name} sent as "
      f"{len(sent)} hyperparameters, code in s3://{bucket}/{key}")
'''),
]
