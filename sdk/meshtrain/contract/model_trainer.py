"""A job made by SageMaker SDK v3's ModelTrainer: what it carries beyond the JobSpec's fields.

SDK v3 changed how a job reaches its container: the code arrives as a ``code`` channel, the
launcher as an ``sm_drivers`` channel the request starts (``/bin/bash`` running
``sm_train.sh``), hyperparameters keep strings raw (``safe_serialize``), and the script gets
them as ``--key value`` in the given order with JSON values. `ModelTrainerSpec` keeps what a
ModelTrainer said that a JobSpec has no field for: the SageMaker request's own parts (kept as
the request carries them, PascalCase) and the code/launcher settings hosts need (kept as the
SDK's sourcecode.json / distributed.json hold them).

On SageMaker, meshtrain's own driver (in the ``sm_drivers`` channel, beside a copy of the
runtime) hands the host to the bootstrap with `JOB_FILE`: the job keys a v2 request would have
put in the hyperparameters (``sagemaker_program``, the distribution's), which the host merges
into hyperparameters.json.
"""

from __future__ import annotations

import json
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

CODE_CHANNEL = "code"
DRIVERS_CHANNEL = "sm_drivers"
JOB_FILE = "meshtrain_job.json"
TRAIN_SCRIPT = "sm_train.sh"
"""The drivers channel's start script; the request runs it as the SDK's does."""
SETTINGS_KEY = "sagemaker_meshtrain_model_trainer"
"""A framework parameter (hyperparameters.json): this spec's host settings, as JSON."""
CONTAINER_ENTRYPOINT = ["/bin/bash"]
CONTAINER_ARGUMENTS = [
    "-c",
    f"chmod +x /opt/ml/input/data/{DRIVERS_CHANNEL}/{TRAIN_SCRIPT} "
    f"&& /opt/ml/input/data/{DRIVERS_CHANNEL}/{TRAIN_SCRIPT}",
]
"""How a ModelTrainer's request starts the container (the SDK's constants)."""


def safe_serialize(value: Any) -> str:
    """SDK v3's hyperparameter and argument encoding: a string as is, anything else as JSON."""
    if isinstance(value, str):
        return value
    try:
        return json.dumps(value)
    except TypeError:
        return str(value)


def safe_deserialize(value: Any) -> Any:
    """The drivers' reading of a value: JSON-decoded when it is JSON, else the string."""
    if not isinstance(value, str):
        return value
    try:
        return json.loads(value)
    except json.JSONDecodeError:
        return value


class ModelTrainerSpec(BaseModel):
    """What a ModelTrainer job carries beyond the JobSpec's own fields."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    base_job_name: str
    """The S3 layout's prefix: code and local channels under <base>/<job>/input/<channel>,
    default output s3://<bucket>/<base>."""
    input_s3_key_prefix: str | None = None
    """Replaces base_job_name as the uploads' leading prefix (the SDK's argument)."""
    source_code: dict[str, Any] = Field(default_factory=dict)
    """SourceCode as the SDK's sourcecode.json holds it."""
    distributed: dict[str, Any] = Field(default_factory=dict)
    """The launcher as the SDK's distributed.json holds it ({} without one)."""
    mp_parameters: str | None = None
    """The ``mp_parameters`` hyperparameter the SDK adds for Torchrun(smp=...)."""
    request: dict[str, Any] = Field(default_factory=dict)
    """CreateTrainingJob's top-level fields the JobSpec has none for (VpcConfig, RetryStrategy,
    EnableNetworkIsolation, CheckpointConfig, TensorBoardOutputConfig, ...). A
    CheckpointConfig or TensorBoardOutputConfig without its S3 location gets the default one."""
    algorithm: dict[str, Any] = Field(default_factory=dict)
    """AlgorithmSpecification fields beyond mode, image and metrics (TrainingImageConfig)."""
    resources: dict[str, Any] = Field(default_factory=dict)
    """ResourceConfig as the SDK sends it."""
    output: dict[str, Any] = Field(default_factory=dict)
    """OutputDataConfig less S3OutputPath (KmsKeyId, CompressionType)."""
    stopping: dict[str, Any] = Field(default_factory=dict)
    """StoppingCondition as the SDK sends it."""

    @property
    def entry_script(self) -> str:
        return str(self.source_code.get("entry_script") or "")

    @property
    def command(self) -> str | None:
        return self.source_code.get("command") or None

    def host_settings(self) -> dict[str, Any]:
        """What a host needs beyond the v2 job keys (SETTINGS_KEY's value)."""
        return {"source_code": self.source_code, "distributed": self.distributed}
