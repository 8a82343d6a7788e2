"""`sagemaker.train.ModelTrainer` and `Mode`, as SDK v3 (3.27.0) has them, on meshtrain.

```python
# from sagemaker.train import ModelTrainer
# from sagemaker.train.model_trainer import Mode
from meshtrain.sagemaker.train import ModelTrainer
from meshtrain.sagemaker.train.model_trainer import Mode
```

The same fields, defaults and checks as the SDK's pydantic model (unknown fields refused, every
mistake a `meshtrain.ConfigError` before any request, upload or process). Where the job runs
follows `compute.instance_type` as for `meshtrain.Estimator`: unset means local processes
(meshtrain's default, which needs nothing), ``ml.*`` SageMaker (the SDK's request, meshtrain's
drivers), ``k8s:ml.*`` Kubernetes, ``slurm`` Slurm; `Mode.LOCAL_CONTAINER` runs on meshtrain's
local Docker backend. docs/sagemaker-v3.md lists what differs.
"""

from __future__ import annotations

import os
from typing import Any

from pydantic import ConfigDict, Field, PrivateAttr

from meshtrain.contract.errors import ConfigError
from meshtrain.job import TrainingJob
from meshtrain.pipes import drop_output_to_closed_pipes
from meshtrain.sagemaker.train import _checks, _job
from meshtrain.sagemaker.train._base import RaisesConfigError
from meshtrain.sagemaker.train.configs import (
    Channel,
    CheckpointConfig,
    Compute,
    InfraCheckConfig,
    InputData,
    MetricDefinition,
    Networking,
    OutputDataConfig,
    RemoteDebugConfig,
    RetryStrategy,
    SessionChainingConfig,
    SourceCode,
    StoppingCondition,
    Tag,
    TensorBoardOutputConfig,
    TrainingImageConfig,
)
from meshtrain.sagemaker.train.distributed import MPI, Torchrun
from meshtrain.sagemaker.train.mode import Mode
from meshtrain.sagemaker.train.shapes import ModelPackageConfig


class ModelTrainer(RaisesConfigError):
    """Train a script on a cluster: SDK v3's `ModelTrainer`, run by meshtrain.

    meshtrain addition: `backend_options`, the options of meshtrain's target (`jobs_dir` for
    local jobs, `namespace` for Kubernetes, `partition` for Slurm, `poll_seconds`, ...).
    """

    model_config = ConfigDict(arbitrary_types_allowed=True, validate_assignment=True,
                              extra="forbid")

    training_mode: Mode = Mode.SAGEMAKER_TRAINING_JOB
    sagemaker_session: Any = None
    role: str | None = None
    base_job_name: str | None = None
    input_s3_key_prefix: str | None = None
    source_code: SourceCode | None = None
    distributed: Torchrun | MPI | None = None
    compute: Compute | None = None
    networking: Networking | None = None
    stopping_condition: StoppingCondition | None = None
    training_image: str | None = None
    training_image_config: TrainingImageConfig | None = None
    algorithm_name: str | None = None
    output_data_config: OutputDataConfig | None = None
    input_data_config: list[Channel | InputData] | None = None
    checkpoint_config: CheckpointConfig | None = None
    training_input_mode: str | None = "File"
    environment: dict[str, str] | None = Field(default_factory=dict)
    hyperparameters: dict[str, Any] | str | None = Field(default_factory=dict)
    tags: list[Tag] | None = None
    local_container_root: str | None = Field(default_factory=os.getcwd)
    model_package_config: ModelPackageConfig | None = None
    backend_options: dict[str, Any] | None = None

    _latest_training_job: TrainingJob | None = PrivateAttr(default=None)
    _tensorboard_output_config: TensorBoardOutputConfig | None = PrivateAttr(default=None)
    _retry_strategy: RetryStrategy | None = PrivateAttr(default=None)
    _infra_check_config: InfraCheckConfig | None = PrivateAttr(default=None)
    _session_chaining_config: SessionChainingConfig | None = PrivateAttr(default=None)
    _remote_debug_config: RemoteDebugConfig | None = PrivateAttr(default=None)
    _metric_definitions: list[MetricDefinition] | None = PrivateAttr(default=None)

    def model_post_init(self, __context: Any) -> None:
        """The SDK's checks and defaults, then meshtrain's checks of the whole job."""
        _checks.check_image(self.training_image, self.algorithm_name)
        _checks.check_source_code(self.source_code, self.distributed)
        _checks.check_distributed(self.distributed)
        if isinstance(self.hyperparameters, str):
            self.hyperparameters = _checks.load_hyperparameters(self.hyperparameters)
        if self.base_job_name is None:
            repository = str(self.training_image).split("/")[-1].split(":")[0].split("@")[0]
            self.base_job_name = f"{repository}-job"
        if self.compute is None:
            self.compute = Compute(instance_count=_job.DEFAULT_INSTANCE_COUNT)
        elif self.compute.instance_count is None:
            self.compute.instance_count = _job.DEFAULT_INSTANCE_COUNT
        if self.compute.volume_size_in_gb is None:
            self.compute.volume_size_in_gb = _job.DEFAULT_VOLUME_SIZE
        _checks.check_compute(self.compute)
        if self.stopping_condition is None:
            self.stopping_condition = StoppingCondition()
        if self.stopping_condition.max_runtime_in_seconds is None:
            self.stopping_condition.max_runtime_in_seconds = _job.DEFAULT_MAX_RUNTIME_IN_SECONDS
        self._check_networking()
        self.dry_run_job()  # every check meshtrain makes for the job, now

    def _check_networking(self) -> None:
        networking = self.networking
        if networking is not None and bool(networking.subnets) != bool(
                networking.security_group_ids):
            raise ConfigError("Networking: subnets and security_group_ids go together "
                              "(SageMaker's VpcConfig needs both). Give both lists, or neither.")

    def dry_run_job(self, input_data_config: list[Channel | InputData] | None = None) -> Any:
        """The JobSpec `train(input_data_config)` would submit; checks everything, starts
        nothing (meshtrain addition)."""
        channels = _job.merge_channels(self.input_data_config, input_data_config)
        return _job.build_job(self, channels)[1]

    def train(
        self,
        input_data_config: list[Channel | InputData] | None = None,
        wait: bool | None = True,
        logs: bool | None = True,
        dry_run: bool = False,
    ) -> None:
        """Run the job: `input_data_config` adds channels (a name given in the constructor is
        replaced); `wait` blocks until it ends (raising `meshtrain.JobFailedError`), showing
        its log with `logs`; `dry_run` checks everything and starts nothing."""
        for name, value in (("wait", wait), ("logs", logs), ("dry_run", dry_run)):
            if value is not None and not isinstance(value, bool):
                raise ConfigError(f"train({name}=...) takes True or False, got {value!r}.")
        channels = _job.merge_channels(self.input_data_config, input_data_config)
        estimator, spec = _job.build_job(self, channels)
        estimator.backend.validate(spec)
        if dry_run:
            return None
        self._latest_training_job = estimator.backend.submit(spec)
        if wait:
            with drop_output_to_closed_pipes():
                self._latest_training_job.wait(logs=bool(logs))
        return None

    @property
    def latest_training_job(self) -> TrainingJob | None:
        """meshtrain's handle of the last job `train()` started (wait, logs, describe, stop)."""
        return self._latest_training_job

    @property
    def output_data(self) -> str:
        """The URI of the last job's output.tar.gz (``<output path>/<job>/output/``)."""
        if self._latest_training_job is None:
            raise ConfigError("No training job is associated with this ModelTrainer. Call "
                              "train() before accessing output_data.")
        model = str(self._latest_training_job.model_data or "")
        return model.rsplit("/", 1)[0] + "/output.tar.gz"

    def with_tensorboard_output_config(
            self, tensorboard_output_config: TensorBoardOutputConfig | None = None
    ) -> ModelTrainer:
        """Send TensorBoard event files (default /opt/ml/output/tensorboard) to S3."""
        self._tensorboard_output_config = tensorboard_output_config or TensorBoardOutputConfig()
        return self

    def with_retry_strategy(self, retry_strategy: RetryStrategy) -> ModelTrainer:
        """Retry the job after an internal SageMaker error."""
        self._retry_strategy = retry_strategy
        return self

    def with_infra_check_config(
            self, infra_check_config: InfraCheckConfig | None = None) -> ModelTrainer:
        """Check the instances before the job starts (default: enabled)."""
        self._infra_check_config = infra_check_config or InfraCheckConfig(
            enable_infra_check=True)
        return self

    def with_session_chaining_config(
            self, session_chaining_config: SessionChainingConfig | None = None) -> ModelTrainer:
        """Chain session tags into the job's role session (default: enabled)."""
        self._session_chaining_config = session_chaining_config or SessionChainingConfig(
            enable_session_tag_chaining=True)
        return self

    def with_remote_debug_config(
            self, remote_debug_config: RemoteDebugConfig | None = None) -> ModelTrainer:
        """Allow SSM access into the training container (default: enabled)."""
        self._remote_debug_config = remote_debug_config or RemoteDebugConfig(
            enable_remote_debug=True)
        return self

    def with_checkpoint_config(
            self, checkpoint_config: CheckpointConfig | None = None) -> ModelTrainer:
        """Sync /opt/ml/checkpoints with S3 (default location under the base job name)."""
        self.checkpoint_config = checkpoint_config or CheckpointConfig()
        return self

    def with_metric_definitions(
            self, metric_definitions: list[MetricDefinition]) -> ModelTrainer:
        """Metrics SageMaker reads from the job's log."""
        self._metric_definitions = metric_definitions
        return self
