"""Cells of the SageMaker SDK v3 notebook (sagemaker_v3.ipynb): ModelTrainer code that switches
to meshtrain by its import line."""

from notebook_cells import FIND_EXAMPLES

SAGEMAKER_V3 = [
    ("md", """
# SageMaker SDK v3's ModelTrainer, switched to meshtrain by its import line

SageMaker Python SDK v3 trains with `sagemaker.train.ModelTrainer` and typed configs
(`SourceCode`, `Compute`, `InputData`, ...) and `distributed=Torchrun(smp=SMP(...))`. Code
written for it runs on meshtrain after one change: the import lines name `meshtrain.sagemaker`
instead of `sagemaker`. Everything below the imports is the SDK's code, unchanged:

1. the same ModelTrainer on local processes (no `instance_type`: meshtrain's default target),
   hybrid sharding on 2 processes, and its loss curve;
2. on SageMaker (`ml.g5.12xlarge`, 2 instances): the `CreateTrainingJob` request is the one the
   SDK sends for these arguments, its code in a `code` channel, the container started by the
   `sm_drivers` channel's `sm_train.sh` (meshtrain's drivers: they hand each host to meshtrain's
   runtime, which applies the SMP parameters).

**AWS access**: boto3's usual chain (profile, SSO, environment, instance role) and region.
`AWS_ENDPOINT_URL` sends every request elsewhere: **leave it unset for real AWS**. meshtrain's
tests set it to a local moto server, which accepts the request and marks the job completed
without running it: the checks at the end read back what was sent. Set `SAGEMAKER_ROLE` (an IAM
role SageMaker can assume) and `MESHTRAIN_IMAGE_URI` (meshtrain's image from `containers/` in
your ECR, or an AWS PyTorch training image).
"""),
    ("md", "## 1. Setup: the import lines"),
    ("code", '''
import json
import os
import tarfile
from pathlib import Path

import boto3
import matplotlib.pyplot as plt

# from sagemaker.train import ModelTrainer
# from sagemaker.train.configs import Compute, SourceCode
# from sagemaker.train.distributed import SMP, Torchrun
from meshtrain.sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train.configs import Compute, SourceCode
from meshtrain.sagemaker.train.distributed import SMP, Torchrun
''' + FIND_EXAMPLES + '''
endpoint = os.environ.get("AWS_ENDPOINT_URL")   # unset for real AWS
role = os.environ["SAGEMAKER_ROLE"]         # an IAM role SageMaker can assume
image = os.environ["MESHTRAIN_IMAGE_URI"]   # meshtrain's image in your ECR, or an AWS PyTorch one
print("AWS:", endpoint or "real AWS", "| role:", role)
source_code = SourceCode(source_dir=str(EXAMPLES / "sagemaker"), entry_script="train.py")
'''),
    ("md", """
## 2. Try it locally

No `compute.instance_type`: the hosts are local processes (SDK v3 would start an `ml.m5.xlarge`
here; meshtrain's default needs nothing). One host, 2 processes, sharded over both.
"""),
    ("code", '''
local = ModelTrainer(
    training_image=image, source_code=source_code,
    distributed=Torchrun(process_count_per_node=2, smp=SMP(hybrid_shard_degree=2)),
    hyperparameters={"steps": 12},
)
local.train()
output = Path(local.latest_training_job.model_data.removeprefix("file://"))
with tarfile.open(output.with_name("output.tar.gz")) as tar:   # the job's /opt/ml/output/data
    local_losses = json.load(tar.extractfile("losses.json"))["train:loss"]
fig, ax = plt.subplots(figsize=(7, 3.5))
ax.plot(local_losses, marker="o", markersize=3)
ax.set(xlabel="step", ylabel="training loss", title="ModelTrainer on local processes (1 x 2)")
ax.grid(alpha=0.3)
plt.show()
'''),
    ("md", """
## 3. Launch on SageMaker

The SDK's arguments for SageMaker: a role, the instances, SMP's `hybrid_shard_degree=4` (one
process per GPU: sharded within each `ml.g5.12xlarge`, replicated across the two).
"""),
    ("code", '''
trainer = ModelTrainer(
    training_image=image, role=role, source_code=source_code,
    compute=Compute(instance_type="ml.g5.12xlarge", instance_count=2),
    distributed=Torchrun(smp=SMP(hybrid_shard_degree=4)),
    hyperparameters={"steps": 12}, base_job_name="meshtrain-v3-notebook",
)
trainer.train(wait=False)
job = trainer.latest_training_job
description = job.describe()
print(job.name, description["TrainingJobStatus"])
print("channels:", [channel["ChannelName"] for channel in description["InputDataConfig"]])
'''),
    ("md", """
## 4. Follow the job

`wait()` prints the job's status changes and its hosts' CloudWatch logs until it ends (Ctrl-C
stops waiting, not the job); with `trainer.train()` (wait=True, the SDK's default) it would have
done so already.
"""),
    ("code", '''
job.wait()
print("status:", job.status)
'''),
    ("md", """
## 5. Check the results

What SageMaker received, read back from `DescribeTrainingJob` and S3: SDK v3's hyperparameters
(strings as they are, the SMP parameters as `mp_parameters`), the code uploaded as the `code`
channel under `<base job name>/<job>/input/code`, and meshtrain's drivers in `sm_drivers`.
"""),
    ("code", '''
assert local_losses[-1] < 0.8 * local_losses[0], "the local try-out did not learn"
assert description["AlgorithmSpecification"]["TrainingImage"] == image
assert description["ResourceConfig"]["InstanceType"] == "ml.g5.12xlarge"
assert description["ResourceConfig"]["InstanceCount"] == 2
assert description["HyperParameters"] == {"steps": "12",
                                          "mp_parameters": '{"hybrid_shard_degree": 4}'}
channels = {c["ChannelName"]: c["DataSource"]["S3DataSource"]["S3Uri"]
            for c in description["InputDataConfig"]}
assert list(channels) == ["code", "sm_drivers"]
bucket, prefix = channels["code"].removeprefix("s3://").split("/", 1)
assert prefix == f"meshtrain-v3-notebook/{job.name}/input/code"
listed = boto3.client("s3").list_objects_v2(Bucket=bucket, Prefix=prefix)["Contents"]
assert f"{prefix}/train.py" in [item["Key"] for item in listed]
print(f"local loss {local_losses[0]:.3f} -> {local_losses[-1]:.3f}; job {job.name}: code in "
      f"{channels['code']}")
'''),
]
