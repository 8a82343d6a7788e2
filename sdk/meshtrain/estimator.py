"""Estimator: the SageMaker PyTorch estimator's arguments -> JobSpec -> backend -> TrainingJob."""

from __future__ import annotations

import inspect
import sys
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from meshtrain.backends import Backend
from meshtrain.channels import check_channel_modes
from meshtrain.contract._messages import arguments_error_from
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import encode_distribution
from meshtrain.contract.job_environment import check_values_given
from meshtrain.contract.jobspec import JobSpec
from meshtrain.estimator_checks import (
    check_backend_options,
    check_cluster,
    check_inputs,
    check_runtime_limits,
    check_writable_path,
    inline_parameters,
    layout_notes,
)
from meshtrain.estimator_sources import check_entry_point, check_sources
from meshtrain.estimator_values import (
    check_environment,
    check_hyperparameters,
    check_metric_definitions,
    check_optional_strings,
    check_reserved_hyperparameters,
    check_scalars,
    check_tags,
)
from meshtrain.job import TrainingJob
from meshtrain.naming import check_job_name, name_from_base
from meshtrain.pipes import drop_output_to_closed_pipes
from meshtrain.targets import resolve_target

DEFAULT_BASE_JOB_NAME = "meshtrain"


SHARED_FIELDS = (
    "entry_point", "source_dir", "dependencies", "hyperparameters", "instance_type",
    "instance_count", "output_path", "checkpoint_s3_uri", "checkpoint_local_path", "environment",
    "max_run", "max_wait", "use_spot_instances", "volume_size", "input_mode", "image_uri", "role",
    "tags", "metric_definitions", "container_log_level", "framework_version", "py_version",
)
"""JobSpec fields the Estimator takes and keeps under the same name: build_spec() and
from_spec() are derived from this one list (tests/sdk/test_estimator_fields.py)."""
SPEC_ONLY_FIELDS = ("job_name", "distribution", "inputs", "input_content_types", "input_configs",
                    "region", "model_trainer")
"""JobSpec fields set another way: at fit(), from the validated distribution, by the backend,
by SDK v3's ModelTrainer (meshtrain.sagemaker.train)."""


class Estimator:
    """Run a training script as a (multi-host, multi-process) job.

    The arguments are those of the SageMaker Python SDK's ``sagemaker.pytorch.PyTorch``;
    ``instance_type="local"`` runs the hosts as local processes, ``ml.*`` on Amazon SageMaker.
    Everything is validated here, before any job directory, process or request exists.

    meshtrain additions: with ``plan_model`` (a preset such as ``"llama2-70b"``, a config.json
    path or an HF config dict) and ``preflight=True``, ``fit()`` first estimates the memory of
    the layout asked for and refuses one that cannot fit, showing a layout that would
    (``plan_options``: ``seq_len``, ``micro_batch``, ``precision``, ... of ``meshtrain.plan``).
    """

    def __init__(
        self,
        entry_point: str,
        source_dir: str | None = None,
        hyperparameters: dict[str, Any] | None = None,
        instance_type: str = "local",
        instance_count: int = 1,
        distribution: dict[str, Any] | None = None,
        role: str | None = None,
        image_uri: str | None = None,
        output_path: str | None = None,
        checkpoint_s3_uri: str | None = None,
        checkpoint_local_path: str | None = None,
        environment: dict[str, str] | None = None,
        max_run: int = 24 * 60 * 60,
        max_wait: int | None = None,
        use_spot_instances: bool = False,
        volume_size: int = 30,
        input_mode: str = "File",
        base_job_name: str | None = None,
        dependencies: list[str] | None = None,
        tags: list[dict[str, str]] | None = None,
        metric_definitions: list[dict[str, str]] | None = None,
        container_log_level: int = 20,
        framework_version: str | None = None,
        py_version: str | None = None,
        preflight: bool = True,
        plan_model: Any = None,
        plan_options: dict[str, Any] | None = None,
        **backend_options: Any,
    ) -> None:
        self.target = resolve_target(instance_type)
        self.backend_options = check_backend_options(self.target, backend_options,
                                                     _own_arguments())
        self.source_dir, self.entry_point = check_entry_point(entry_point, source_dir)
        self.hyperparameters = check_hyperparameters(
            {} if hyperparameters is None else hyperparameters)
        self.instance_type, self.instance_count = instance_type, instance_count
        self.distribution_config, self.world_size, degrees = check_cluster(
            distribution, self.target, instance_count, self.entry_point)
        self.distribution = inline_parameters(distribution, self.distribution_config)
        self._layout_notes = layout_notes(self.distribution_config, degrees,
                                          self.world_size // instance_count)
        self.dependencies = check_sources(self.source_dir, dependencies)
        check_optional_strings(role=role, image_uri=image_uri, output_path=output_path,
                               checkpoint_s3_uri=checkpoint_s3_uri,
                               checkpoint_local_path=checkpoint_local_path,
                               framework_version=framework_version, py_version=py_version)
        if self.target.on_this_machine:
            check_writable_path("output_path", output_path)
            check_writable_path("checkpoint_local_path", checkpoint_local_path)
        self.role, self.image_uri, self.output_path = role, image_uri, output_path
        self.checkpoint_s3_uri = checkpoint_s3_uri
        self.checkpoint_local_path = checkpoint_local_path
        self.environment = check_environment({} if environment is None else environment)
        check_scalars(volume_size=volume_size, input_mode=input_mode, preflight=preflight,
                      container_log_level=container_log_level,
                      use_spot_instances=use_spot_instances)
        check_runtime_limits(max_run, max_wait, use_spot_instances)
        self.max_run, self.max_wait, self.use_spot_instances = max_run, max_wait, use_spot_instances
        self.volume_size, self.input_mode = volume_size, input_mode
        if base_job_name is not None:
            check_job_name(base_job_name, what="base_job_name")
        self.base_job_name = base_job_name
        self.tags, self.metric_definitions = check_tags(tags), check_metric_definitions(
            metric_definitions)
        self.container_log_level = container_log_level
        self.framework_version, self.py_version = framework_version, py_version
        if plan_options is not None and not isinstance(plan_options, dict):
            raise ConfigError(f"plan_options must be a dict, got {type(plan_options).__name__}.")
        self.preflight, self.plan_model = preflight, plan_model
        self.plan_options = dict(plan_options or {})
        # the typed config, encoded as the spec will encode it (no throw-away JobSpec)
        check_reserved_hyperparameters(self.hyperparameters, encode_distribution(
            self.distribution_config, self.instance_type))
        self._backend: Backend | None = None
        self.latest_training_job: TrainingJob | None = None

    @property
    def backend(self) -> Backend:
        if self._backend is None:
            self._backend = self.target.backend(**self.backend_options)
        return self._backend

    def build_spec(self, inputs: Any = None, job_name: str | None = None) -> JobSpec:
        """The JobSpec `fit()` would submit; validates everything, starts nothing."""
        channels, content_types, configs = check_inputs(inputs)
        check_channel_modes(configs, self.input_mode)
        check_values_given(self.environment)
        if job_name is not None:
            name = check_job_name(job_name)
        else:
            name = name_from_base(self.base_job_name or DEFAULT_BASE_JOB_NAME)
        return self._spec(name, inputs=channels, input_content_types=content_types,
                          input_configs=configs)

    def _spec(self, job_name: str, **extra: Any) -> JobSpec:
        try:
            return JobSpec(
                job_name=job_name,
                distribution=self.distribution_config if self.distribution is not None else None,
                **{name: getattr(self, name) for name in SHARED_FIELDS}, **extra)
        except ValidationError as error:  # the checks above should have caught it first
            raise arguments_error_from(error, what="Estimator") from None

    def fit(
        self, inputs: Any = None, wait: bool = True, logs: bool = True, job_name: str | None = None
    ) -> TrainingJob:
        """Start a training job; with `wait`, block until it ends (raising JobFailedError)."""
        if not isinstance(wait, bool) or not isinstance(logs, bool):
            raise ConfigError(f"fit(wait=..., logs=...) take True or False, got wait={wait!r}, "
                              f"logs={logs!r}.")
        spec = self.build_spec(inputs, job_name)
        self.check_fits()
        self.backend.validate(spec)
        for note in self._layout_notes:  # once per fit(), before the job's own output
            print(f"meshtrain: warning: {note}", file=sys.stderr)
        self.latest_training_job = self.backend.submit(spec)
        if wait:  # a closed stdout (`| head`) neither ends the client nor eats a Ctrl-C
            with drop_output_to_closed_pipes():
                self.latest_training_job.wait(logs=logs)
        return self.latest_training_job

    def check_fits(self) -> None:
        """Pre-flight: raise ConfigError if the layout cannot fit (needs `plan_model`)."""
        if not self.preflight or self.plan_model is None:
            return
        from meshtrain.plan.preflight import preflight

        try:
            preflight(self.distribution_config, model=self.plan_model,
                      instance_type=self.target.hardware_type,
                      instance_count=self.instance_count,
                      processes_per_host=self.distribution_config.torch_distributed
                      .processes_per_host, **self.plan_options)
        except TypeError as error:
            raise ConfigError(f"plan_options: {error}. See meshtrain.plan.preflight.") from None

    @property
    def model_data(self) -> str | None:
        """URI of the last job's model.tar.gz."""
        if self.latest_training_job is None:
            return None
        return self.latest_training_job.model_data

    @classmethod
    def attach(cls, training_job_name: str, backend: str | None = None,
               **backend_options: Any) -> Estimator:
        """Rebuild an Estimator from an existing job, wherever it runs: every backend is
        searched (meshtrain.registry; `backend`, e.g. "sagemaker", searches one). The options
        are those of the backends (jobs_dir, boto_session, namespace, kubeconfig, ...)."""
        from meshtrain.registry import find_job

        found = find_job(training_job_name, backend, **backend_options)
        spec = found.backend.load_spec(training_job_name)
        taken = {k: v for k, v in backend_options.items() if k in found.kind.options()}
        estimator = cls.from_spec(spec, **taken)
        estimator.latest_training_job = found.job
        return estimator

    @classmethod
    def from_spec(cls, spec: JobSpec, **backend_options: Any) -> Estimator:
        """An Estimator that would submit `spec` again (a script-only source stays one)."""
        arguments = {name: getattr(spec, name) for name in SHARED_FIELDS}
        keep = spec.source_dir.startswith("s3://") or Path(spec.source_dir).is_dir()
        if not keep:  # a script-only source: the script is the entry point again
            arguments.update(entry_point=spec.source_dir, source_dir=None)
        distribution = spec.distribution.to_dict() if spec.distribution else None
        return cls(distribution=distribution, **arguments, **backend_options)


def _own_arguments() -> list[str]:
    """The Estimator's own keyword names (for a did-you-mean on a mistyped one)."""
    parameters = inspect.signature(Estimator.__init__).parameters.values()
    return [p.name for p in parameters
            if p.name != "self" and p.kind is not inspect.Parameter.VAR_KEYWORD]
