"""Launcher cells in the shape of AWS's SMP v2 example notebooks (arguments written anew).

Each cell is the `PyTorch(...)` arguments and the `fit()` inputs, as data, so that the real
SageMaker Python SDK (make_golden.py) and meshtrain (test_sagemaker_real_sdk.py) build the same
job. Inputs: an S3 URI string, or ("TrainingInput" | "FileSystemInput", keyword arguments).
"""

from __future__ import annotations

from typing import Any

ROLE = "arn:aws:iam::123456789012:role/SageMakerRole"
OUTPUT = "s3://smp-results-bucket/llama"
VPC = {"subnets": ["subnet-0a1b2c3d4e5f60718"], "security_group_ids": ["sg-0a1b2c3d4e5f60718"]}
FSX = {"file_system_id": "fs-0123456789abcdef0", "file_system_type": "FSxLustre",
       "file_system_access_mode": "rw"}
HYPERPARAMETERS = {
    "activation_checkpointing": 1, "auto_wrap_policy": "transformer_auto_wrap_policy",
    "backward_fetch_policy": "backward_pre", "beta1": 0.9, "beta2": 0.95, "bf16": 1,
    "checkpoint_dir": "/opt/ml/checkpoints", "checkpoint_freq": 50, "clean_cache": 0,
    "delayed_param": 1, "epochs": 100, "forward_prefetch": 1, "hidden_width": 4096,
    "limit_all_gathers": 1, "logging_freq": 1, "lr": 0.0001, "lr_decay_iters": 47683,
    "lr_decay_style": "cosine", "max_context_width": 4096, "max_steps": 100, "min_lr": 1e-05,
    "model_type": "llama_v2", "num_heads": 32, "num_layers": 32, "train_batch_size": 2,
    "use_smp_implementation": 1, "validation_freq": 200, "vocab_size": 32000, "zipped_data": 0,
}
S3_DATA = {"train": "s3://smp-data-bucket/c4/train", "test": "s3://smp-data-bucket/c4/val"}
FSX_DATA = {"train": ("FileSystemInput", {**FSX, "directory_path": "/abcdefgh/c4/train"}),
            "test": ("FileSystemInput", {**FSX, "directory_path": "/abcdefgh/c4/val"})}


def smp(**parameters: Any) -> dict[str, Any]:
    return {"torch_distributed": {"enabled": True},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": parameters}}}


def cell(instance_type: str, instance_count: int, framework_version: str, py_version: str,
         distribution: dict[str, Any] | None, inputs: Any, **extra: Any) -> dict[str, Any]:
    arguments = {"entry_point": "train.py", "role": ROLE, "instance_type": instance_type,
                 "instance_count": instance_count, "framework_version": framework_version,
                 "py_version": py_version, "hyperparameters": dict(HYPERPARAMETERS),
                 "output_path": OUTPUT, **extra}
    if distribution is not None:
        arguments["distribution"] = distribution
    return {"arguments": arguments, "inputs": inputs}


CELLS: dict[str, dict[str, Any]] = {
    "smp-llama2-p4d-x2-s3": cell(
        "ml.p4d.24xlarge", 2, "2.2.0", "py310",
        smp(activation_loading_horizon=4, hybrid_shard_degree=16, sm_activation_offloading=True,
            tensor_parallel_degree=1),
        S3_DATA, volume_size=400, max_run=86400, debugger_hook_config=False,
        checkpoint_s3_uri="s3://smp-results-bucket/checkpoints"),
    "smp-llama2-p4d-x4-fsx": cell(
        "ml.p4d.24xlarge", 4, "2.3.1", "py311",
        smp(activation_loading_horizon=2, hybrid_shard_degree=32, sm_activation_offloading=False,
            tensor_parallel_degree=1),
        FSX_DATA, volume_size=400, debugger_hook_config=False,
        checkpoint_local_path="/opt/ml/checkpoints", **VPC),
    "smp-tp8-p5-x2-s3": cell(
        "ml.p5.48xlarge", 2, "2.4.1", "py311",
        smp(hybrid_shard_degree=2, tensor_parallel_degree=8),
        S3_DATA, volume_size=500, debugger_hook_config=False,
        checkpoint_s3_uri="s3://smp-results-bucket/checkpoints"),
    "smp-tp8-p5-x8-fsx": cell(
        "ml.p5.48xlarge", 8, "2.5.1", "py311",
        smp(hybrid_shard_degree=8, tensor_parallel_degree=8, sm_activation_offloading=True,
            activation_loading_horizon=8),
        FSX_DATA, debugger_hook_config=False, **VPC),
    "smp-p4d-x1-pt20": cell(
        "ml.p4d.24xlarge", 1, "2.0.1", "py310", smp(hybrid_shard_degree=8),
        {"train": "s3://smp-data-bucket/c4/train"}, debugger_hook_config=False),
    "smp-p4d-x2-pt21-spot": cell(
        "ml.p4d.24xlarge", 2, "2.1.2", "py310", smp(hybrid_shard_degree=16),
        S3_DATA, use_spot_instances=True, max_run=36000, max_wait=72000,
        checkpoint_s3_uri="s3://smp-results-bucket/checkpoints"),
    "smp-p4de-x4-tp4-fsx": cell(
        "ml.p4de.24xlarge", 4, "2.3.1", "py311",
        smp(hybrid_shard_degree=8, tensor_parallel_degree=4),
        FSX_DATA, volume_size=400, debugger_hook_config=False, **VPC),
    "smp-p5-x4-fsx-checkpoints": cell(
        "ml.p5.48xlarge", 4, "2.4.1", "py311",
        smp(hybrid_shard_degree=32, sm_activation_offloading=True),
        FSX_DATA, debugger_hook_config=False, checkpoint_local_path="/opt/ml/checkpoints",
        **VPC),
    "smp-p4d-x8-both-checkpoints": cell(
        "ml.p4d.24xlarge", 8, "2.2.0", "py310", smp(hybrid_shard_degree=64),
        S3_DATA, checkpoint_s3_uri="s3://smp-results-bucket/checkpoints",
        checkpoint_local_path="/opt/ml/checkpoints"),
    "smp-p4d-x2-environment-tags": cell(
        "ml.p4d.24xlarge", 2, "2.3.1", "py311", smp(hybrid_shard_degree=16),
        S3_DATA, environment={"NCCL_DEBUG": "INFO", "FI_EFA_USE_DEVICE_RDMA": "1"},
        tags=[{"Key": "project", "Value": "llama"}], disable_profiler=True,
        debugger_hook_config=False),
    "torchrun-p4d-x1-sharded": cell(
        "ml.p4d.24xlarge", 1, "2.2.0", "py310", {"torch_distributed": {"enabled": True}},
        {"train": ("TrainingInput", {"s3_data": "s3://smp-data-bucket/c4/train",
                                     "distribution": "ShardedByS3Key"}),
         "test": ("TrainingInput", {"s3_data": "s3://smp-data-bucket/c4/val",
                                    "content_type": "application/json"})}),
    "torchrun-p5-x2-fastfile": cell(
        "ml.p5.48xlarge", 2, "2.5.1", "py311", {"torch_distributed": {"enabled": True}},
        {"train": ("TrainingInput", {"s3_data": "s3://smp-data-bucket/c4/train",
                                     "input_mode": "FastFile"})},
        debugger_hook_config=False),
    "torchrun-p4d-x4-fastfile-estimator": cell(
        "ml.p4d.24xlarge", 4, "2.3.0", "py311", {"torch_distributed": {"enabled": True}},
        S3_DATA, input_mode="FastFile", debugger_hook_config=False),
    "single-g5-manifest-pipe": cell(
        "ml.g5.2xlarge", 1, "2.5.1", "py311", None,
        {"train": ("TrainingInput", {"s3_data": "s3://smp-data-bucket/train.manifest",
                                     "s3_data_type": "ManifestFile"}),
         "augmented": ("TrainingInput", {
             "s3_data": "s3://smp-data-bucket/aug.manifest",
             "s3_data_type": "AugmentedManifestFile", "attribute_names": ["source-ref", "label"],
             "input_mode": "Pipe", "compression": "Gzip", "record_wrapping": "RecordIO"})}),
    "smp-p4d-x2-no-inputs-metrics": cell(
        "ml.p4d.24xlarge", 2, "2.4.1", "py311", smp(hybrid_shard_degree=16),
        None, metric_definitions=[{"Name": "train:loss", "Regex": "loss=([0-9.]+)"}],
        max_retry_attempts=3, keep_alive_period_in_seconds=1800),
}


def build_inputs(inputs: Any, classes: Any) -> Any:
    """`fit()`'s inputs with `classes.TrainingInput` / `classes.FileSystemInput`."""
    if inputs is None or isinstance(inputs, str):
        return inputs
    built = {}
    for channel, value in inputs.items():
        if isinstance(value, str):
            built[channel] = value
        else:
            kind, arguments = value
            built[channel] = getattr(classes, kind)(**arguments)
    return built


def create_buckets() -> None:
    """The output bucket the cells name (a notebook's user has it already)."""
    import boto3

    boto3.client("s3").create_bucket(
        Bucket=OUTPUT.removeprefix("s3://").split("/")[0],
        CreateBucketConfiguration={"LocationConstraint": "us-west-2"})
