"""SageMaker SDK v3's local containers on meshtrain's CPU image, against meshtrain's local run.

One script (scripts/model_trainer_train.py), one layout (2 hosts x 1 process,
`Torchrun(smp=SMP(hybrid_shard_degree=2))`), three runs whose losses must agree:

- meshtrain's ModelTrainer on local processes (the reference, once for the module);
- the REAL SDK 3.27's ModelTrainer(training_mode=Mode.LOCAL_CONTAINER) with meshtrain's image:
  its docker-compose file, its sm_drivers (environment.py, torchrun_driver.py), its torchrun
  and `--mp_parameters`; meshtrain_runtime.init() reads the SMP parameters it was given, and the
  SDK packs the hosts' model folder into model.tar.gz as it expects;
- meshtrain's ModelTrainer with Mode.LOCAL_CONTAINER, on meshtrain's local Docker backend.

The real SDK runs in its own environment (tests/sdk/sagemaker_v3/sdk_v3_env.py, built once
under ~/.cache/meshtrain-tests) and finds the tier's private dockerd through DOCKER_HOST.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

SCRIPTS = Path(__file__).resolve().parent / "scripts"
SDK_V3_TESTS = Path(__file__).resolve().parents[1] / "sdk" / "sagemaker_v3"
sys.path.insert(0, str(SDK_V3_TESTS))

from ci_guards import missing_component  # noqa: E402
from sdk_v3_env import sdk_environment, sdk_python  # noqa: E402

from meshtrain.sagemaker.train import ModelTrainer  # noqa: E402
from meshtrain.sagemaker.train.configs import Compute, SourceCode  # noqa: E402
from meshtrain.sagemaker.train.distributed import SMP, Torchrun  # noqa: E402
from meshtrain.sagemaker.train.model_trainer import Mode  # noqa: E402

ENTRY = "model_trainer_train.py"
STEPS = 4
TOLERANCE = 1e-6
SDK_CELL = """
from sagemaker.train import ModelTrainer
from sagemaker.train.model_trainer import Mode
from sagemaker.train.configs import SourceCode, Compute
from sagemaker.train.distributed import Torchrun, SMP

trainer = ModelTrainer(
    training_mode=Mode.LOCAL_CONTAINER, training_image={image!r},
    source_code=SourceCode(source_dir={source!r}, entry_script={entry!r}),
    compute=Compute(instance_type="local_cpu", instance_count=2),
    distributed=Torchrun(smp=SMP(hybrid_shard_degree=2)),
    hyperparameters={{"steps": {steps}}}, environment={{"OMP_NUM_THREADS": "1"}},
    local_container_root={root!r})
trainer.train()
"""


def report_in(model_tar: Path) -> dict:
    with tarfile.open(model_tar) as tar:
        return json.load(tar.extractfile("report.json"))


def trainer(**given) -> ModelTrainer:
    return ModelTrainer(source_code=SourceCode(source_dir=str(SCRIPTS), entry_script=ENTRY),
                        distributed=Torchrun(smp=SMP(hybrid_shard_degree=2)),
                        hyperparameters={"steps": STEPS}, **given)


@pytest.fixture(scope="module")
def local_report(tmp_path_factory):
    """meshtrain's own local run of the script: the reference losses."""
    jobs = tmp_path_factory.mktemp("local-jobs")
    local = trainer(training_image="unused-by-local-processes",
                    compute=Compute(instance_type="local", instance_count=2),
                    backend_options={"jobs_dir": str(jobs)})
    local.train(logs=False)
    report = report_in(Path(local.latest_training_job.model_data.removeprefix("file://")))
    assert report["world_size"] == 2 and report["hybrid_shard_degree"] == 2
    assert len(report["losses"]) == STEPS
    return report


def assert_same_losses(report: dict, reference: dict) -> None:
    assert report["world_size"] == 2 and report["hybrid_shard_degree"] == 2
    assert report["losses"] == pytest.approx(reference["losses"], abs=TOLERANCE, rel=0)


@pytest.mark.multiprocess
def test_real_sdk_local_container_trains_like_meshtrains_local_run(
        meshtrain_image, local_report, tmp_path):
    if shutil.which("docker-compose") is None and shutil.which("docker") is None:
        missing_component("no docker compose for SageMaker SDK v3's local containers")
    python = sdk_python()
    root = tmp_path / "container-root"
    root.mkdir()
    cell = SDK_CELL.format(image=meshtrain_image, source=str(SCRIPTS), entry=ENTRY,
                           steps=STEPS, root=str(root))
    env = sdk_environment({**os.environ, "AWS_DEFAULT_REGION": "us-west-2"}, tmp_path)
    done = subprocess.run([str(python), "-c", cell], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=900)
    log = done.stdout + done.stderr
    assert done.returncode == 0, log[-6000:]
    assert "rank 1 of 2" in log and "rank 0 of 2" in log  # one process in each container
    model = root / "compressed_artifacts" / "model.tar.gz"  # where the SDK leaves it
    report = report_in(model)
    assert_same_losses(report, local_report)
    assert report["argv"] == ["--steps", str(STEPS),
                              "--mp_parameters", '{"hybrid_shard_degree": 2}']


@pytest.mark.multiprocess
def test_meshtrain_local_container_trains_like_local_processes(
        meshtrain_image, local_report, tmp_path, home):
    containers = trainer(training_mode=Mode.LOCAL_CONTAINER, training_image=meshtrain_image,
                         compute=Compute(instance_count=2))
    containers.train(logs=False)
    job = containers.latest_training_job
    assert job.describe()["TrainingJobStatus"] == "Completed"
    assert_same_losses(report_in(Path(job.model_data.removeprefix("file://"))), local_report)
