"""A bad ModelTrainer is a meshtrain.ConfigError before anything starts: no request reaches
AWS, no job folder or process exists. Each message names the field and ends in one period."""

from __future__ import annotations

import pytest

import meshtrain
from meshtrain.sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train.configs import (
    Compute,
    InputData,
    InstanceGroup,
    SourceCode,
    StoppingCondition,
)
from meshtrain.sagemaker.train.distributed import MPI, SMP, Torchrun

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:1.0-gpu"
ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "train.py").write_text("print('train')\n")
    (root / "run.sh").write_text("echo run\n")
    return str(root)


def trainer(source, **given):
    arguments = {"training_image": IMAGE, "role": ROLE,
                 "source_code": SourceCode(source_dir=source, entry_script="train.py")}
    return ModelTrainer(**{**arguments, **given})


BAD_TRAINERS = {
    "int environment value": lambda s: trainer(s, environment={"EPOCHS": 3}),
    "unknown SMP field": lambda s: trainer(s, distributed=Torchrun(smp=SMP(hybrid_shard=2))),
    "distributed without entry_script": lambda s: trainer(
        s, source_code=SourceCode(source_dir=s), distributed=Torchrun()),
    "file:// channel": lambda s: trainer(
        s, input_data_config=[InputData(channel_name="train", data_source=f"file://{s}")]),
    "unknown ModelTrainer field": lambda s: trainer(s, instance_type="ml.p4d.24xlarge"),
    "no image": lambda s: trainer(s, training_image=None),
    "marketplace algorithm": lambda s: trainer(s, training_image=None, algorithm_name="xgb"),
    "entry_script outside source_dir": lambda s: trainer(
        s, source_code=SourceCode(source_dir=s, entry_script="missing.py")),
    "requirements outside source_dir": lambda s: trainer(
        s, source_code=SourceCode(source_dir=s, entry_script="train.py",
                                  requirements="requirements.txt")),
    "entry_script without source_dir": lambda s: trainer(
        s, source_code=SourceCode(entry_script="train.py")),
    "shell entry script": lambda s: trainer(
        s, source_code=SourceCode(source_dir=s, entry_script="run.sh")),
    "missing local channel": lambda s: trainer(
        s, input_data_config=[InputData(channel_name="train", data_source=f"{s}/nothing")]),
    "SMP degree not dividing the world": lambda s: trainer(
        s, compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
        distributed=Torchrun(smp=SMP(hybrid_shard_degree=3))),
    "SMP relation": lambda s: trainer(
        s, distributed=Torchrun(smp=SMP(hybrid_shard_degree=2, context_parallel_degree=4))),
    "unknown instance type": lambda s: trainer(s, compute=Compute(instance_type="ml.p4dd.24x")),
    "heterogeneous cluster": lambda s: trainer(s, compute=Compute(instance_groups=[
        InstanceGroup(instance_type="ml.p4d.24xlarge", instance_count=1,
                      instance_group_name="a")])),
    "MPI options": lambda s: trainer(
        s, distributed=MPI(process_count_per_node=2, mpi_additional_options=["-x", "A"])),
    "bad hyperparameter name": lambda s: trainer(s, hyperparameters={"bad name": 1}),
    "reserved hyperparameter": lambda s: trainer(s, hyperparameters={"mp_parameters": {}}),
    "hyperparameters file missing": lambda s: trainer(s, hyperparameters=f"{s}/hp.json"),
    "subnets without security groups": lambda s: trainer(
        s, networking=meshtrain.sagemaker.train.configs.Networking(subnets=["subnet-0abc"])),
    "bad compute type": lambda s: trainer(s, compute=Compute(instance_count="two")),
}


@pytest.mark.parametrize("case", list(BAD_TRAINERS))
def test_bad_trainer_is_a_config_error_before_anything(aws, source, tmp_path, monkeypatch,
                                                       case):
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    with pytest.raises(meshtrain.ConfigError) as raised:
        BAD_TRAINERS[case](source)
    message = str(raised.value)
    assert message.endswith(".") and not message.endswith(".."), message
    assert aws.requests == []
    assert not (tmp_path / "home").exists()


BAD_TRAINS = {
    "file:// channel at train()": lambda t, s: t.train(
        input_data_config=[InputData(channel_name="x", data_source=f"file://{s}")]),
    "channel named code": lambda t, s: t.train(
        input_data_config=[InputData(channel_name="code", data_source="s3://b/c")]),
    "wait not a bool": lambda t, s: t.train(wait="yes"),
    "spot without max_wait": lambda t, s: (
        setattr(t.compute, "enable_managed_spot_training", True), t.train())[1],
    "max_wait without spot": lambda t, s: (setattr(t, "stopping_condition", StoppingCondition(
        max_runtime_in_seconds=60, max_wait_time_in_seconds=120)), t.train())[1],
    "no role": lambda t, s: (setattr(t, "role", None), t.train())[1],
}


@pytest.mark.parametrize("case", list(BAD_TRAINS))
def test_bad_train_is_a_config_error_before_any_request(aws, source, case):
    good = trainer(source, compute=Compute(instance_type="ml.p4d.24xlarge"))
    with pytest.raises(meshtrain.ConfigError) as raised:
        BAD_TRAINS[case](good, source)
    assert str(raised.value).endswith(".")
    assert aws.requests == []


def test_assignment_is_checked_too(source):
    good = trainer(source)
    with pytest.raises(meshtrain.ConfigError, match="environment"):
        good.environment = {"A": 1}
    with pytest.raises(meshtrain.ConfigError, match="random_seed"):
        SMP().random_seed = "seed"


def test_dry_run_checks_everything_and_sends_nothing(aws, source):
    good = trainer(source, compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
                   distributed=Torchrun(smp=SMP(hybrid_shard_degree=16)))
    assert good.train(dry_run=True) is None
    assert aws.requests == []
    assert good.latest_training_job is None
