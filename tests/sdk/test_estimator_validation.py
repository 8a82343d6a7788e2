"""Every invalid Estimator argument is a ConfigError raised before any job directory or process."""

from __future__ import annotations

from pathlib import Path

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.sagemaker import FileSystemInput, TrainingInput


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    root.mkdir()
    (root / "train.py").write_text("print('train')\n")
    (root / "run.sh").write_text("echo hi\n")
    return root


def child_pids() -> set[int]:
    pids = set()
    for task in Path("/proc/self/task").iterdir():
        text = (task / "children").read_text().split()
        pids.update(int(p) for p in text)
    return pids


TD = {"torch_distributed": {"enabled": True, "processes_per_host": 2}}


def smp(**parameters):
    return {**TD, "smdistributed": {"modelparallel": {"enabled": True,
                                                      "parameters": parameters}}}


CASES = {
    "missing-entry": ({"entry_point": "nope.py"}, "not a file"),
    "entry-outside": ({"entry_point": "../train.py"}, "inside source_dir"),
    "bad-source-dir": ({"source_dir": "/no/such/dir"}, "not a directory"),
    "shell-entry-with-torchrun": ({"entry_point": "run.sh", "distribution": TD}, "*.py"),
    "hps-not-dict": ({"hyperparameters": [1, 2]}, "must be a dict"),
    "hp-not-json": ({"hyperparameters": {"f": object()}}, "JSON-serialisable"),
    "hp-empty-key": ({"hyperparameters": {"": 1}}, "non-empty strings"),
    "instance-count-zero": ({"instance_count": 0}, "positive int"),
    "instance-count-str": ({"instance_count": "2"}, "positive int"),
    "unknown-instance-type": ({"instance_type": "gpu-box"}, "not a known target"),
    "local-gpu-multi-host": ({"instance_type": "local_gpu", "instance_count": 2},
                             "instance_count=1"),
    "tp-does-not-divide": ({"instance_count": 2, "distribution": smp(tensor_parallel_degree=3)},
                           "tensor_parallel_degree=3 does not divide world size 4 (2 hosts x 2 "
                           "processes). Use 1, 2 or 4."),
    "shard-does-not-divide": ({"distribution": smp(hybrid_shard_degree=4)},
                              "hybrid_shard_degree=4 does not divide the data-parallel size 2"),
    "ep-with-tp": ({"instance_count": 2,
                    "distribution": smp(tensor_parallel_degree=2, expert_parallel_degree=3)},
                   "expert_parallel_degree=3 must divide the resolved hybrid_shard_degree=2 x "
                   "tensor_parallel_degree=2 = 4"),
    "typo-key": ({"distribution": smp(tensor_paralel_degree=2)}, "Did you mean"),
    "mpi": ({"distribution": {"mpi": {"enabled": True}}}, "torch_distributed"),
    "env-bad-name": ({"environment": {"1X": "a"}}, "environment variable name"),
    "env-not-str": ({"environment": {"X": 1}}, "must be a string"),
    "max-run-zero": ({"max_run": 0}, "max_run"),
    "spot-without-wait": ({"use_spot_instances": True}, "max_wait"),
    "max-wait-too-small": ({"max_run": 100, "max_wait": 50}, "max_wait"),
    "bad-base-job-name": ({"base_job_name": "bad_name!"}, "not a valid SageMaker job name"),
    "missing-dependency": ({"dependencies": ["/no/such/lib"]}, "does not exist"),
    "unknown-local-option": ({"namespace": "team-a"}, "not honoured by local jobs"),
}
FIT_CASES = {
    "bad-channel-name": ({"inputs": {"bad channel": "/tmp"}}, "channel name"),
    "missing-input": ({"inputs": {"train": "/no/such/data"}}, "does not exist"),
    "sharded-s3-input-locally": ({"inputs": TrainingInput("s3://bucket/data",
                                                           distribution="ShardedByS3Key")},
                                 "FullyReplicated"),
    "fsx-input-locally": ({"inputs": FileSystemInput("fs-0123456789abcdef0", "EFS", "/d")},
                          "only SageMaker jobs in its VPC"),
    "bad-job-name": ({"job_name": "x" * 64}, "not a valid SageMaker job name"),
    "checkpoint-s3-bucket-locally": ({"estimator": {"checkpoint_s3_uri": "s3://B_c/c"}},
                                     "not a valid S3 bucket name"),
}


@pytest.fixture
def jobs_dir(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("MESHTRAIN_HOME", str(home))
    return home / "jobs"


@pytest.mark.parametrize(("overrides", "fragment"), CASES.values(), ids=CASES.keys())
def test_invalid_estimator_argument(source, jobs_dir, overrides, fragment):
    before = child_pids()
    arguments = {"entry_point": "train.py", "source_dir": str(source), **overrides}
    with pytest.raises(ConfigError) as info:
        Estimator(**arguments).fit(wait=False)
    assert fragment in str(info.value)
    assert not jobs_dir.exists()
    assert child_pids() == before


@pytest.mark.parametrize(("overrides", "fragment"), FIT_CASES.values(), ids=FIT_CASES.keys())
def test_invalid_fit_argument(source, jobs_dir, overrides, fragment):
    before = child_pids()
    estimator = Estimator("train.py", source_dir=str(source), **overrides.pop("estimator", {}))
    with pytest.raises(ConfigError) as info:
        estimator.fit(wait=False, **overrides)
    assert fragment in str(info.value)
    assert not jobs_dir.exists()
    assert child_pids() == before


def test_entry_point_without_source_dir_packs_the_script_alone(source, monkeypatch):
    monkeypatch.chdir(source)
    estimator = Estimator("train.py")
    spec = estimator.build_spec()
    assert spec.entry_point == "train.py"
    assert Path(spec.source_dir) == source / "train.py"


def test_parameters_json_path_is_inlined_into_the_spec(source, tmp_path):
    params = tmp_path / "smp.json"
    params.write_text('{"hybrid_shard_degree": 2}')
    dist = {**TD, "smdistributed": {"modelparallel": {"enabled": True,
                                                      "parameters": str(params)}}}
    spec = Estimator("train.py", source_dir=str(source), distribution=dist).build_spec()
    assert spec.distribution.raw_parameters == {"hybrid_shard_degree": 2}
    assert spec.to_json().count('"hybrid_shard_degree": 2') == 1  # in the JSON, not the path
    assert spec.distribution_hyperparameters()["mp_parameters"] == {"hybrid_shard_degree": 2}


def test_preflight_refuses_a_layout_that_cannot_fit_before_any_request(source, jobs_dir):
    no_sharding = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"hybrid_shard_degree": 1}}}}
    estimator = Estimator("train.py", source_dir=str(source), instance_type="ml.p4d.24xlarge",
                          role="arn:aws:iam::123456789012:role/Trainer", distribution=no_sharding,
                          plan_model="llama2-70b")
    with pytest.raises(ConfigError) as info:
        estimator.fit(wait=False)
    assert "hybrid_shard_degree" in str(info.value)
    assert estimator._backend is None  # refused before the SageMaker backend even existed
    estimator.preflight = False  # opting out skips the estimate
    estimator.check_fits()


def test_preflight_accepts_a_layout_that_fits(source):
    sharded = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"hybrid_shard_degree": 8}}}}
    estimator = Estimator("train.py", source_dir=str(source), instance_type="ml.p4d.24xlarge",
                          role="arn:aws:iam::123456789012:role/Trainer", distribution=sharded,
                          plan_model="llama2-7b", plan_options={"seq_len": 2048})
    estimator.check_fits()


def test_unknown_plan_option_is_a_config_error(source):
    estimator = Estimator("train.py", source_dir=str(source), plan_model="llama2-7b",
                          instance_type="ml.p4d.24xlarge",
                          role="arn:aws:iam::123456789012:role/Trainer",
                          plan_options={"sequence_length": 10})
    with pytest.raises(ConfigError, match="plan_options"):
        estimator.check_fits()
