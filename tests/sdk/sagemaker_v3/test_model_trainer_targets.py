"""A ModelTrainer maps to a JobSpec for every meshtrain target, and the hosts read it as SDK
v3's drivers would give it to the script (no process started here: the specs and the host's
reading of its config files)."""

from __future__ import annotations

import json

import pytest

from meshtrain.backends.kubernetes.render import render_spec
from meshtrain.contract import hyperparameters as hp
from meshtrain.contract import model_trainer as mt
from meshtrain.contract.jobspec import write_host_config
from meshtrain.contract.paths import OptMLPaths
from meshtrain.sagemaker.train import Mode, ModelTrainer
from meshtrain.sagemaker.train.configs import Compute, SourceCode
from meshtrain.sagemaker.train.distributed import SMP, Torchrun
from meshtrain_runtime.host.contract import HostContract, build_sm_env

HYPERPARAMETERS = {"name": "run 1", "numeric_text": "3", "steps": 4, "layers": [2, 4],
                   "flag": True}


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "train.py").write_text("print('train')\n")
    (root / "reqs.txt").write_text("numpy\n")
    return str(root)


def trainer(source, **given):
    return ModelTrainer(
        training_image="meshtrain:1.0", role="arn:aws:iam::123456789012:role/SageMakerRole",
        source_code=SourceCode(source_dir=source, entry_script="train.py",
                               requirements="reqs.txt"),
        distributed=Torchrun(process_count_per_node=2, smp=SMP(hybrid_shard_degree=2)),
        hyperparameters=HYPERPARAMETERS, **given)


@pytest.mark.parametrize(("mode", "instance_type", "target"), [
    (Mode.SAGEMAKER_TRAINING_JOB, None, "local"),
    (Mode.SAGEMAKER_TRAINING_JOB, "local_docker", "local_docker"),
    (Mode.SAGEMAKER_TRAINING_JOB, "k8s:ml.p4d.24xlarge", "k8s:ml.p4d.24xlarge"),
    (Mode.SAGEMAKER_TRAINING_JOB, "slurm", "slurm"),
    (Mode.SAGEMAKER_TRAINING_JOB, "ml.p4d.24xlarge", "ml.p4d.24xlarge"),
    (Mode.LOCAL_CONTAINER, None, "local_docker"),
    (Mode.LOCAL_CONTAINER, "ml.m5.xlarge", "local_docker"),
    (Mode.LOCAL_CONTAINER, "local_gpu", "local_gpu"),
])
def test_every_target_gets_the_same_job(source, mode, instance_type, target):
    spec = trainer(source, training_mode=mode,
                   compute=Compute(instance_type=instance_type)).dry_run_job()
    assert spec.instance_type == target
    assert spec.entry_point == "train.py" and spec.hyperparameters == HYPERPARAMETERS
    assert spec.distribution.smp.hybrid_shard_degree == 2
    assert spec.distribution.torch_distributed.processes_per_host == 2
    assert spec.model_trainer.mp_parameters == '{"hybrid_shard_degree": 2}'
    assert spec.job_name.startswith("meshtrain-job-")


def test_kubernetes_renders_the_job_with_sdk_v3_hyperparameters(source):
    kubernetes = trainer(source, compute=Compute(instance_type="k8s:ml.p4d.24xlarge",
                                                 instance_count=2))
    kubernetes.train(dry_run=True)  # the backend's checks: it renders the manifests
    config_map, _job = render_spec(kubernetes.dry_run_job(), namespace="default")
    sent = json.loads(config_map["data"]["hyperparameters.json"])
    assert sent["name"] == "run 1" and sent["numeric_text"] == "3"  # strings as they are
    assert sent["layers"] == "[2, 4]" and sent["flag"] == "true"
    assert json.loads(sent[mt.SETTINGS_KEY])["source_code"]["requirements"] == "reqs.txt"


def host_contract(spec, base, submit):
    paths = OptMLPaths(base)
    write_host_config(spec, paths.input_config_dir, "algo-1", submit)
    return HostContract.read(paths), paths


def test_host_gives_the_script_sdk_v3s_arguments_and_variables(source, tmp_path):
    spec = trainer(source).dry_run_job()
    contract, paths = host_contract(spec, tmp_path / "opt" / "ml", "file:///x.tar.gz")
    args = contract.user_args()
    pairs = dict(zip(args[::2], args[1::2], strict=True))
    assert pairs == {"--name": "run 1", "--numeric_text": "3", "--steps": "4",
                     "--layers": "[2, 4]", "--flag": "true",
                     "--mp_parameters": '{"hybrid_shard_degree": 2}'}
    assert contract.distribution().smp.hybrid_shard_degree == 2
    assert contract.requirements_file == paths.code_dir / "reqs.txt"
    env = build_sm_env(contract)
    assert env["SM_ENTRY_SCRIPT"] == "train.py" and env["SM_SOURCE_DIR"] == str(paths.code_dir)
    assert json.loads(env["SM_DISTRIBUTED_CONFIG"])["process_count_per_node"] == 2
    assert json.loads(env["SM_HP_MP_PARAMETERS"]) == {"hybrid_shard_degree": 2}


def test_sagemaker_host_reads_the_job_keys_from_the_drivers_channel(source, tmp_path):
    """On SageMaker hyperparameters.json holds the user's values only (the request's); the
    job's keys come from meshtrain_job.json in sm_drivers, the code from the code channel."""
    spec = trainer(source, compute=Compute(instance_type="ml.p4d.24xlarge")).dry_run_job()
    paths = OptMLPaths(tmp_path / "opt" / "ml")
    paths.input_config_dir.mkdir(parents=True)
    paths.hyperparameters_file.write_text(json.dumps(spec.request_hyperparameters()))
    drivers = paths.channel_dir(mt.DRIVERS_CHANNEL)
    drivers.mkdir(parents=True)
    (drivers / mt.JOB_FILE).write_text(json.dumps(
        spec.job_hyperparameters("/opt/ml/input/data/code")))
    paths.channel_dir(mt.CODE_CHANNEL).mkdir(parents=True)
    contract = HostContract.read(paths)
    assert contract.entry_point == "train.py" and contract.torch_distributed
    assert contract.processes_per_host == 2
    assert contract.code_dir == paths.channel_dir(mt.CODE_CHANNEL)  # /opt/ml as the base dir
    assert contract.reserved[hp.SUBMIT_DIRECTORY] == "/opt/ml/input/data/code"
    assert "--mp_parameters" in contract.user_args()


def test_estimator_jobs_keep_the_toolkits_conventions(source, tmp_path):
    """The SDK v2 path is untouched: sorted toolkit arguments, requirements.txt by name."""
    from meshtrain import Estimator

    spec = Estimator("train.py", source_dir=source, hyperparameters={"b": "x", "a": [1]},
                     ).build_spec(job_name="v2")
    contract, paths = host_contract(spec, tmp_path / "opt" / "ml", "file:///x.tar.gz")
    assert contract.model_trainer is None
    assert contract.user_args() == ["-a", "[1]", "-b", "x"]
    assert contract.requirements_file == paths.code_dir / "requirements.txt"
    assert "SM_ENTRY_SCRIPT" not in build_sm_env(contract)
