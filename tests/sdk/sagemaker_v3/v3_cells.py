"""Notebook cells written for SageMaker Python SDK v3, run twice: with the SDK's import line and
with meshtrain's. Each cell builds a ModelTrainer and calls train(); both runs must send
SageMaker the same CreateTrainingJob (test_model_trainer_requests.py).

The cells use the SDK's own names only; `prelude(package)` is the one line that differs
(``sagemaker`` or ``meshtrain.sagemaker``). Paths and ids come from `namespace()`.
"""

from __future__ import annotations

import json
from pathlib import Path

ACCOUNT = "123456789012"  # moto's
REGION = "us-west-2"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
IMAGE = f"{ACCOUNT}.dkr.ecr.{REGION}.amazonaws.com/meshtrain:1.0-gpu"
DATA_BUCKET = "data-bucket"
DEFAULT_BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"
FILE_SYSTEM = "fs-0123456789abcdef0"

PRELUDE = """\
from {package}.train import ModelTrainer
from {package}.train.configs import (
    SourceCode, Compute, InputData, Channel, DataSource, S3DataSource, FileSystemDataSource,
    StoppingCondition, CheckpointConfig, OutputDataConfig, Networking, Tag, RetryStrategy,
    MetricDefinition, TensorBoardOutputConfig, InfraCheckConfig, RemoteDebugConfig,
    SessionChainingConfig, TrainingImageConfig, ShuffleConfig)
from {package}.train.distributed import Torchrun, SMP, MPI
"""

CELLS = {
    "plain-p4d-x1": """
trainer = ModelTrainer(training_image=IMAGE, role=ROLE,
                       source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
                       compute=Compute(instance_type="ml.p4d.24xlarge"))
trainer.train(wait=False, logs=False)
""",
    "torchrun-p4d-x2": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE,
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py",
                           requirements="requirements.txt"),
    compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
    distributed=Torchrun(),
    input_data_config=[InputData(channel_name="train", data_source=f"s3://{DATA_BUCKET}/train")])
trainer.train(wait=False, logs=False)
""",
    "smp-p4d-x2": """
smp = SMP(hybrid_shard_degree=8, tensor_parallel_degree=2, sm_activation_offloading=True,
          activation_loading_horizon=4, fsdp_cache_flush_warnings=False, random_seed=12345)
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE, base_job_name="llama-smp",
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2, volume_size_in_gb=500),
    distributed=Torchrun(process_count_per_node=8, smp=smp),
    hyperparameters={"max_steps": 100, "model_type": "llama_v2"})
trainer.train(wait=False, logs=False)
""",
    "channels-s3-and-local": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE,
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.g5.12xlarge"),
    input_data_config=[
        InputData(channel_name="train", data_source=f"s3://{DATA_BUCKET}/train/"),
        InputData(channel_name="local", data_source=DATA, content_type="text/plain"),
        InputData(channel_name="labels", data_source=DATA_FILE),
        Channel(channel_name="sharded", input_mode="Pipe", content_type="text/csv",
                data_source=DataSource(s3_data_source=S3DataSource(
                    s3_data_type="S3Prefix", s3_uri=f"s3://{DATA_BUCKET}/sharded",
                    s3_data_distribution_type="ShardedByS3Key")),
                shuffle_config=ShuffleConfig(seed=7)),
        InputData(channel_name="manifest", data_source=S3DataSource(
            s3_data_type="ManifestFile", s3_uri=f"s3://{DATA_BUCKET}/manifest.json")),
        InputData(channel_name="validation", data_source=f"s3://{DATA_BUCKET}/old")])
trainer.train(input_data_config=[
    InputData(channel_name="validation", data_source=f"s3://{DATA_BUCKET}/validation"),
    InputData(channel_name="test", data_source=DATA)], wait=False, logs=False)
""",
    "hyperparameters-json-types": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE,
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.p5.48xlarge"), distributed=Torchrun(),
    hyperparameters={"epochs": 3, "lr": 0.0003, "name": "run-1", "numeric_text": "3",
                     "json_text": '{"a": 1}', "resume": True, "dry": False, "seed": None,
                     "layers": [1, "two", 3.5, None], "nested": {"opt": {"betas": [0.9, 0.95]}},
                     "empty": [], "negative": -2, "big": 10 ** 12, "text": "héllo wörld"})
trainer.train(wait=False, logs=False)
""",
    "environment-runtime-checkpoint": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE,
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
    distributed=Torchrun(smp=SMP(hybrid_shard_degree=16)),
    environment={"NCCL_DEBUG": "INFO", "HF_HOME": "/opt/ml/hf", "EMPTY": ""},
    stopping_condition=StoppingCondition(max_runtime_in_seconds=7200),
    checkpoint_config=CheckpointConfig(s3_uri=f"s3://{DATA_BUCKET}/checkpoints",
                                       local_path="/opt/ml/checkpoints/run"))
trainer.train(wait=False, logs=False)
""",
    "default-locations": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE, base_job_name="my_job", input_s3_key_prefix="pipes/p1",
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py",
                           ignore_patterns=["*.md", "data"]),
    compute=Compute(instance_type="ml.p4d.24xlarge"),
    input_data_config=[InputData(channel_name="local", data_source=DATA)],
).with_checkpoint_config().with_tensorboard_output_config()
trainer.train(wait=False, logs=False)
""",
    "request-options": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE, training_input_mode="FastFile",
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2, volume_kms_key_id="vk",
                    keep_alive_period_in_seconds=600, enable_managed_spot_training=True),
    distributed=Torchrun(process_count_per_node=4),
    networking=Networking(subnets=["subnet-0abc"], security_group_ids=["sg-0abc"],
                          enable_network_isolation=False,
                          enable_inter_container_traffic_encryption=True),
    stopping_condition=StoppingCondition(max_runtime_in_seconds=3000,
                                         max_wait_time_in_seconds=6000),
    output_data_config=OutputDataConfig(s3_output_path=f"s3://{DATA_BUCKET}/out",
                                        kms_key_id="ok", compression_type="NONE"),
    training_image_config=TrainingImageConfig(training_repository_access_mode="Vpc"),
    tags=[Tag(key="team", value="nlp"), Tag(key="owner", value="ml-platform")],
    hyperparameters=HYPERPARAMETERS_FILE,
).with_retry_strategy(RetryStrategy(maximum_retry_attempts=2)).with_metric_definitions(
    [MetricDefinition(name="train:loss", regex="loss=([0-9.]+)")]
).with_infra_check_config().with_remote_debug_config(RemoteDebugConfig(enable_remote_debug=False)
).with_session_chaining_config()
trainer.train(wait=False, logs=False)
""",
    "mpi-and-efs": """
trainer = ModelTrainer(
    training_image=IMAGE, role=ROLE,
    source_code=SourceCode(source_dir=SOURCE, entry_script="train.py"),
    compute=Compute(instance_type="ml.p4d.24xlarge", instance_count=2),
    distributed=MPI(process_count_per_node=4),
    networking=Networking(subnets=["subnet-0abc"], security_group_ids=["sg-0abc"]),
    input_data_config=[InputData(channel_name="efs", content_type="application/x-parquet",
                                 data_source=FileSystemDataSource(
                                     file_system_id=FILE_SYSTEM, file_system_type="EFS",
                                     file_system_access_mode="ro", directory_path="/data"))])
trainer.train(wait=False, logs=False)
""",
}


def prelude(package: str) -> str:
    """The import lines: ``sagemaker`` (the SDK) or ``meshtrain.sagemaker``."""
    return PRELUDE.format(package=package)


def make_files(root: Path) -> dict[str, str]:
    """The source folder, data and hyperparameters file the cells name; their namespace."""
    source = root / "src"
    for name, text in {"train.py": "print('training')\n", "requirements.txt": "numpy\n",
                       "README.md": "# notes\n", "pkg/__init__.py": "", "pkg/model.py": "X = 1\n",
                       "data/big.bin": "0" * 64, "__pycache__/train.cpython-311.pyc": "junk",
                       ".git/HEAD": "ref: x\n"}.items():
        (source / name).parent.mkdir(parents=True, exist_ok=True)
        (source / name).write_text(text)
    data = root / "data"
    (data / "part").mkdir(parents=True)
    (data / "a.txt").write_text("1 2 3\n")
    (data / "part" / "b.txt").write_text("4 5 6\n")
    labels = root / "labels.csv"
    labels.write_text("y\n1\n")
    hyperparameters = root / "hyperparameters.json"
    hyperparameters.write_text(json.dumps({"epochs": 2, "optimizer": "adamw", "warmup": 0.1}))
    return {"SOURCE": str(source), "DATA": str(data), "DATA_FILE": str(labels),
            "HYPERPARAMETERS_FILE": str(hyperparameters), "IMAGE": IMAGE, "ROLE": ROLE,
            "DATA_BUCKET": DATA_BUCKET, "FILE_SYSTEM": FILE_SYSTEM}
