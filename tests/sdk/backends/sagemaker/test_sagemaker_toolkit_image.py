"""An AWS PyTorch image runs meshtrain's job without meshtrain installed.

The "image" is a virtual environment laid out as AWS's PyTorch training images are: the real
SageMaker training toolkit and PyTorch toolkit from the package registry (`train` is their entry,
``SAGEMAKER_TRAINING_MODULE=sagemaker_pytorch_container.training:main`` as the images set it),
torch (shared from the test environment through a path entry, with a `torchrun` console script
as torch's wheel installs it), and no meshtrain. /opt/ml is laid out from the CreateTrainingJob
request moto received; the toolkit downloads sourcedir.tar.gz from moto's S3 itself, installs its
requirements.txt, and starts torchrun; the script's `import meshtrain_runtime` resolves to the
copy meshtrain shipped in the archive, and init()/transform() run a 2-rank HSDP step on gloo.
The environment is built once under ~/.cache/meshtrain-tests (about 20 s, 190 MB). The docker
tier runs the same job inside a container (tests/docker/test_sagemaker_toolkit_container.py)
with the steps below.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import sysconfig
from pathlib import Path

import boto3
import pytest
from sagemaker_moto import REGION, ROLE
from test_sagemaker_container_entry import free_port, lay_out_host

from meshtrain.sagemaker import PyTorch, TrainingInput

TOOLKITS = ("sagemaker-training==5.1.4", "sagemaker-pytorch-training==3.0.0")
IMAGE_DIR = Path.home() / ".cache" / "meshtrain-tests" / "sagemaker-toolkit-5.1.4"
TORCHRUN = "#!{python}\nimport sys\nfrom torch.distributed.run import main\nsys.exit(main())\n"
SCRIPT = """\
import json, os, sys
import torch
import meshtrain_runtime

code_dir = os.path.dirname(os.path.abspath(__file__))
state = meshtrain_runtime.init()
torch.manual_seed(0)
model = meshtrain_runtime.transform(torch.nn.Sequential(torch.nn.Linear(4, 8),
                                                        torch.nn.Linear(8, 1)))
batch = torch.ones(2, 4)
loss = model(batch).pow(2).mean()
loss.backward()
report = {"rank": state.rank, "world_size": state.world_size,
          "hybrid_shard_degree": state.hybrid_shard_degree, "loss": loss.item(),
          "runtime": meshtrain_runtime.__file__, "code_dir": code_dir,
          "data": open(os.path.join(os.environ["SM_CHANNEL_TRAIN"], "part-0")).read()}
open(os.path.join(os.environ["SM_MODEL_DIR"], f"rank-{state.rank}.json"), "w").write(
    json.dumps(report))
"""
DISTRIBUTION = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
                "smdistributed": {"modelparallel": {"enabled": True,
                                                    "parameters": {"hybrid_shard_degree": 2}}}}


def toolkit_image() -> Path:
    """The image's Python: a venv with the toolkits, torch by path entry, no meshtrain."""
    python = IMAGE_DIR / "bin" / "python"
    if not (IMAGE_DIR / "ready").exists():
        subprocess.run([sys.executable, "-m", "venv", "--clear", str(IMAGE_DIR)], check=True)
        subprocess.run([str(python), "-m", "pip", "install", "-q", *TOOLKITS], check=True,
                       timeout=600)
        torchrun = IMAGE_DIR / "bin" / "torchrun"
        torchrun.write_text(TORCHRUN.format(python=python))
        torchrun.chmod(0o755)
        (IMAGE_DIR / "ready").write_text("")
    # Rewritten on every run: the cached image outlives the test venv it was first built from
    # (CI builds a fresh one each time), and a path entry to a deleted venv loses torch.
    site = Path(subprocess.check_output(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        text=True).strip())
    (site / "zz_torch_from_tests.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    return python


def submit_job(aws, tmp_path: Path) -> dict:
    """The notebook's side: a PyTorch estimator from versions, fit(); returns the request."""
    source = tmp_path / "code"
    source.mkdir()
    (source / "train.py").write_text(SCRIPT)
    s3 = boto3.client("s3")
    s3.create_bucket(Bucket="data-bucket", CreateBucketConfiguration={"LocationConstraint": REGION})
    s3.put_object(Bucket="data-bucket", Key="train/part-0", Body=b"7 8 9")
    estimator = PyTorch("train.py", source_dir=str(source), role=ROLE, framework_version="2.5.1",
                        py_version="py311", instance_type="ml.p4d.24xlarge",
                        distribution=DISTRIBUTION)
    estimator.fit({"train": TrainingInput("s3://data-bucket/train")}, job_name="aws-image",
                  wait=False)
    (create,) = aws.find("SageMaker.CreateTrainingJob")
    request = create.json()
    assert "/smdistributed-modelparallel:2.5.1-gpu-py311-cu124" in (
        request["AlgorithmSpecification"]["TrainingImage"])
    return request


def toolkit_environment(request: dict) -> dict[str, str]:
    """What the image and the platform set for the toolkit's `train` (no meshtrain path)."""
    return {**request.get("Environment", {}), "TRAINING_JOB_NAME": request["TrainingJobName"],
            "OMP_NUM_THREADS": "1",
            "SAGEMAKER_TRAINING_MODULE": "sagemaker_pytorch_container.training:main",
            "PET_MASTER_PORT": str(free_port())}


def check_outputs(base: Path, job_base: Path) -> None:
    """Both ranks ran the shipped runtime from the job's code folder (/opt/ml as the job saw
    it: `job_base`) and read the channel the toolkit downloaded."""
    assert (base / "output" / "success").exists()
    reports = [json.loads(p.read_text()) for p in sorted((base / "model").glob("rank-*.json"))]
    assert [r["rank"] for r in reports] == [0, 1]
    for report in reports:
        assert report["world_size"] == 2 and report["hybrid_shard_degree"] == 2
        assert report["runtime"] == str(job_base / "code" / "meshtrain_runtime" / "__init__.py")
        assert report["code_dir"] == str(job_base / "code") and report["data"] == "7 8 9"
    assert reports[0]["loss"] == pytest.approx(reports[1]["loss"], abs=1e-6)
    requirements = (base / "code" / "requirements.txt").read_text()
    assert "pydantic" in requirements  # the runtime's one need beyond torch, for the toolkit


@pytest.mark.multiprocess
def test_aws_image_runs_the_script_through_the_shipped_runtime(aws, tmp_path):
    python = toolkit_image()
    probe = subprocess.run([str(python), "-c", "import meshtrain"], capture_output=True)
    assert probe.returncode != 0  # the image has no meshtrain
    request = submit_job(aws, tmp_path)
    base = tmp_path / "opt" / "ml"
    lay_out_host(request, base, host="localhost")  # a name this machine resolves
    env = {**os.environ, **toolkit_environment(request), "SAGEMAKER_BASE_DIR": str(base),
           "PATH": f"{IMAGE_DIR / 'bin'}:{os.environ['PATH']}"}
    env.pop("PYTHONPATH", None)
    done = subprocess.run([str(IMAGE_DIR / "bin" / "train")], env=env, capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    check_outputs(base, job_base=base)
