"""A JobSpec rebuilt from DescribeTrainingJob, for `Estimator.attach(job_name)`.

The inverse of the request builder, as the SDK's ``_prepare_init_params_from_job_description``
does it: the source is the uploaded ``sourcedir.tar.gz`` in S3 (``source_dir`` becomes that S3
URI, ``entry_point`` the ``sagemaker_program``), the distribution is read back from the
hyperparameters meshtrain added for it.
"""

from __future__ import annotations

from typing import Any

from meshtrain.backends.sagemaker.request import CODE_CHANNEL, NETWORK_ISOLATION_SUBMIT_DIRECTORY
from meshtrain.channels import file_system_uri
from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.hyperparameters import decode_hyperparameters, split_hyperparameters
from meshtrain.contract.jobspec import DEFAULT_CONTAINER_LOG_LEVEL, JobSpec


def _channels(description: dict[str, Any]) -> tuple[dict[str, str], dict[str, Any], str | None]:
    """(channel -> URI, channel -> its config less ChannelName, the code channel's URI)."""
    inputs, configs, code_uri = {}, {}, None
    for channel in description.get("InputDataConfig") or []:
        source = channel["DataSource"]
        if "FileSystemDataSource" in source:
            uri = file_system_uri(source["FileSystemDataSource"])
        else:
            uri = source["S3DataSource"]["S3Uri"]
        if channel["ChannelName"] == CODE_CHANNEL and description.get("EnableNetworkIsolation"):
            code_uri = uri
            continue
        inputs[channel["ChannelName"]] = uri
        configs[channel["ChannelName"]] = {k: v for k, v in channel.items()
                                           if k != "ChannelName"}
    return inputs, configs, code_uri


def spec_from_description(description: dict[str, Any], region: str | None) -> JobSpec:
    """The JobSpec a SageMaker job was (or could have been) started from."""
    decoded = decode_hyperparameters(description.get("HyperParameters") or {})
    reserved, framework, user = split_hyperparameters(decoded)
    inputs, input_configs, code_uri = _channels(description)
    source = str(reserved.get(hp.SUBMIT_DIRECTORY, ""))
    if source == NETWORK_ISOLATION_SUBMIT_DIRECTORY and code_uri:
        source = code_uri
    distribution = hp.decode_distribution(framework, user)
    if distribution and "smdistributed" in distribution:
        user.pop(hp.MP_PARAMETERS)  # it came from the distribution, not from the user
    algorithm = description.get("AlgorithmSpecification", {})
    resources = description.get("ResourceConfig", {})
    stopping = description.get("StoppingCondition", {})
    checkpoint = description.get("CheckpointConfig") or {}
    return JobSpec(
        job_name=description["TrainingJobName"],
        entry_point=str(reserved.get(hp.PROGRAM, "")),
        source_dir=source,
        hyperparameters=user,
        distribution=distribution,
        instance_type=resources.get("InstanceType", ""),
        instance_count=resources.get("InstanceCount", 1),
        volume_size=resources.get("VolumeSizeInGB", 30),
        inputs=inputs,
        input_configs=input_configs,
        output_path=description.get("OutputDataConfig", {}).get("S3OutputPath"),
        checkpoint_s3_uri=checkpoint.get("S3Uri"),
        checkpoint_local_path=checkpoint.get("LocalPath"),
        environment=dict(description.get("Environment") or {}),
        max_run=stopping.get("MaxRuntimeInSeconds", 24 * 60 * 60),
        max_wait=stopping.get("MaxWaitTimeInSeconds"),
        use_spot_instances=bool(description.get("EnableManagedSpotTraining", False)),
        input_mode=algorithm.get("TrainingInputMode", "File"),
        image_uri=algorithm.get("TrainingImage"),
        role=description.get("RoleArn"),
        metric_definitions=[dict(m) for m in algorithm.get("MetricDefinitions") or []],
        container_log_level=int(reserved.get(hp.CONTAINER_LOG_LEVEL,
                                             DEFAULT_CONTAINER_LOG_LEVEL)),
        region=region,
    )
