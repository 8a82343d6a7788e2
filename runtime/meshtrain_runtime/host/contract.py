"""What one host knows from the contract: config files -> a HostContract -> SM_* variables."""

from __future__ import annotations

import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from meshtrain.contract import env as names
from meshtrain.contract import hyperparameters as hp
from meshtrain.contract import model_trainer as mt
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.hyperparameters import (
    decode_hyperparameters,
    env_name,
    env_value,
    split_hyperparameters,
    to_cmd_args,
)
from meshtrain.contract.paths import DEFAULT_BASE_DIR, OptMLPaths

DEFAULT_MASTER_PORT = 7777  # the toolkit's torchrun master port


def _read_json(path: Path, default: Any) -> Any:
    return json.loads(path.read_text()) if path.exists() else default


def count_gpus() -> int:
    """GPUs on this host (MESHTRAIN_NUM_GPUS overrides; torch is not imported here)."""
    if names.MESHTRAIN_NUM_GPUS in os.environ:
        return int(os.environ[names.MESHTRAIN_NUM_GPUS])
    return len([d for d in Path("/dev").glob("nvidia[0-9]*")])


def pod_host() -> str | None:
    """algo-N of a Kubernetes pod, whose shared resourceconfig.json cannot name it: from the
    rank or replica labels its manifest passes in (see meshtrain.backends.kubernetes)."""
    rank = os.environ.get(names.MESHTRAIN_NODE_RANK, "")
    if rank.isdigit():
        return f"algo-{int(rank) + 1}"
    replica_type = os.environ.get(names.MESHTRAIN_REPLICA_TYPE)
    if replica_type:
        offset = os.environ.get(names.MESHTRAIN_HOST_OFFSET, "0")
        return names.host_from_replica(replica_type,
                                       os.environ.get(names.MESHTRAIN_REPLICA_INDEX, ""),
                                       int(offset) if offset.isdigit() else 0)
    return None


@dataclass
class HostContract:
    """The host's view of the job, read from /opt/ml/input/config."""

    paths: OptMLPaths
    hyperparameters: dict[str, Any]
    reserved: dict[str, Any]
    framework_params: dict[str, Any]
    resource_config: dict[str, Any]
    input_data_config: dict[str, Any]
    num_gpus: int = field(default_factory=count_gpus)
    _distribution: DistributionConfig | None = field(default=None, init=False, repr=False)

    @classmethod
    def read(cls, paths: OptMLPaths) -> HostContract:
        """The config files; on SageMaker, a ModelTrainer job's keys come from meshtrain's
        drivers channel (its request's hyperparameters are the user's alone)."""
        encoded = {**_read_json(paths.hyperparameters_file, {}),
                   **_read_json(paths.channel_dir(mt.DRIVERS_CHANNEL) / mt.JOB_FILE, {})}
        decoded = decode_hyperparameters(encoded)
        reserved, framework, user = split_hyperparameters(decoded)
        resource = _read_json(paths.resource_config_file, {})
        resource.setdefault("current_host", pod_host() or "algo-1")
        resource.setdefault("hosts", [resource["current_host"]])
        return cls(paths, user, reserved, framework, resource,
                   _read_json(paths.input_data_config_file, {}))

    @property
    def current_host(self) -> str:
        return self.resource_config["current_host"]

    @property
    def hosts(self) -> list[str]:
        return sorted(self.resource_config["hosts"])

    @property
    def host_rank(self) -> int:
        return self.hosts.index(self.current_host)

    @property
    def replica_group(self) -> int | None:
        """This host's replica group in a fault-tolerant job (the backend says), else None."""
        value = os.environ.get(names.MESHTRAIN_FT_REPLICA_GROUP, "")
        return int(value) if value.isdigit() else None

    @property
    def world_hosts(self) -> list[str]:
        """The hosts of this host's torchrun world: every host, or in a fault-tolerant job
        those of its replica group (hosts in number order, instance_count / N to a group, as
        the backend grouped them: meshtrain.backends.hosts.replica_groups)."""
        groups = os.environ.get(names.MESHTRAIN_FT_REPLICA_GROUPS, "")
        group = self.replica_group
        if group is None or not groups.isdigit() or int(groups) < 1:
            return self.hosts
        ordered = sorted(self.hosts, key=_host_number)
        size = len(ordered) // int(groups)
        return ordered[group * size:(group + 1) * size]

    @property
    def node_rank(self) -> int:
        """This host's torchrun node rank (in its replica group's world when there is one)."""
        return self.world_hosts.index(self.current_host)

    @property
    def entry_point(self) -> str:
        return str(self.reserved.get(hp.PROGRAM, ""))

    @property
    def code_dir(self) -> Path:
        """Where the code is: the submit directory when it is a folder on this host (a
        ModelTrainer job's code channel on SageMaker), else /opt/ml/code (unpacked there)."""
        submit = str(self.reserved.get(hp.SUBMIT_DIRECTORY, ""))
        if not submit.startswith("/"):
            return self.paths.code_dir
        folder = Path(submit)
        if folder.is_relative_to(DEFAULT_BASE_DIR):  # /opt/ml is SAGEMAKER_BASE_DIR's
            folder = self.paths.base / folder.relative_to(DEFAULT_BASE_DIR)
        return folder if folder.is_dir() else self.paths.code_dir

    @property
    def model_trainer(self) -> dict[str, Any] | None:
        """A ModelTrainer job's source_code / distributed settings (None for an Estimator's)."""
        settings = self.framework_params.get(mt.SETTINGS_KEY)
        return settings if isinstance(settings, dict) else None

    @property
    def requirements_file(self) -> Path | None:
        """The requirements to install: SourceCode.requirements for a ModelTrainer job (only
        when given, as SDK v3), else requirements.txt when the code has one (the toolkit)."""
        if self.model_trainer is None:
            return self.code_dir / "requirements.txt"
        requirements = self.model_trainer.get("source_code", {}).get("requirements")
        return self.code_dir / requirements if requirements else None

    @property
    def job_name(self) -> str:
        return str(self.reserved.get(hp.JOB_NAME, ""))

    @property
    def torch_distributed(self) -> bool:
        return bool(self.framework_params.get(hp.TORCH_DISTRIBUTED_ENABLED, False))

    @property
    def processes_per_host(self) -> int:
        return self.distribution().processes_per_host(self.num_gpus)

    @property
    def channels(self) -> list[str]:
        return sorted(self.input_data_config)

    @property
    def master_addr(self) -> str:
        return os.environ.get(names.MESHTRAIN_MASTER_ADDR) or self.world_hosts[0]

    @property
    def master_port(self) -> int:
        return int(os.environ.get(names.MESHTRAIN_MASTER_PORT) or DEFAULT_MASTER_PORT)

    def user_args(self) -> list[str]:
        """The script's arguments: the toolkit's sorted ``--key value`` for an Estimator's job;
        SDK v3's drivers' ``--key <JSON>`` in the given order for a ModelTrainer's."""
        if self.model_trainer is None:
            return to_cmd_args(self.hyperparameters)
        args: list[str] = []
        for key, value in self.hyperparameters.items():
            args += [f"--{key}", mt.safe_serialize(mt.safe_deserialize(value))]
        return args

    def distribution(self) -> DistributionConfig:
        """The distribution the client encoded into the hyperparameters, decoded (once)."""
        if self._distribution is None:
            self._distribution = DistributionConfig.from_dict(
                hp.decode_distribution(self.framework_params, self.hyperparameters))
        return self._distribution

    def training_env(self) -> dict[str, Any]:
        """SM_TRAINING_ENV: every property the toolkit's Environment exposes that we know."""
        p = self.paths
        return {
            "channel_input_dirs": {c: str(p.channel_dir(c)) for c in self.channels},
            "current_host": self.current_host, "hosts": self.hosts,
            "current_instance_type": self.resource_config.get("current_instance_type", "local"),
            "framework_module": names.BOOTSTRAP_MODULE,
            "hyperparameters": self.hyperparameters,
            "additional_framework_parameters": self.framework_params,
            "input_config_dir": str(p.input_config_dir),
            "input_data_config": self.input_data_config,
            "input_dir": str(p.input_dir), "job_name": self.job_name,
            "log_level": self.reserved.get(hp.CONTAINER_LOG_LEVEL, 20),
            "model_dir": str(p.model_dir), "module_dir": str(self.code_dir),
            "module_name": Path(self.entry_point).stem, "network_interface_name":
                self.resource_config.get("network_interface_name", "eth0"),
            "num_cpus": os.cpu_count() or 1, "num_gpus": self.num_gpus, "num_neurons": 0,
            "output_data_dir": str(p.output_data_dir), "output_dir": str(p.output_dir),
            "output_intermediate_dir": str(p.output_intermediate_dir),
            "resource_config": self.resource_config, "user_entry_point": self.entry_point,
        }


def _host_number(host: str) -> tuple[int, str]:
    prefix, _, number = host.rpartition("-")
    return (int(number), prefix) if number.isdigit() else (0, host)


def build_sm_env(contract: HostContract) -> dict[str, str]:
    """The SM_* variables the toolkit exports for the user's script (contract §3.3)."""
    p, env = contract.paths, contract.training_env()
    values: dict[str, Any] = {
        names.SM_HOSTS: contract.hosts, names.SM_CURRENT_HOST: contract.current_host,
        names.SM_CURRENT_HOST_RANK: contract.host_rank, names.SM_HOST_COUNT: len(contract.hosts),
        names.SM_NETWORK_INTERFACE_NAME: env["network_interface_name"],
        names.SM_CURRENT_INSTANCE_TYPE: env["current_instance_type"],
        names.SM_HPS: contract.hyperparameters, names.SM_USER_ENTRY_POINT: contract.entry_point,
        names.SM_USER_ARGS: contract.user_args(), names.SM_MODULE_NAME: env["module_name"],
        names.SM_MODULE_DIR: str(contract.code_dir),
        names.SM_FRAMEWORK_PARAMS: contract.framework_params,
        names.SM_RESOURCE_CONFIG: contract.resource_config,
        names.SM_INPUT_DATA_CONFIG: contract.input_data_config, names.SM_TRAINING_ENV: env,
        names.SM_LOG_LEVEL: env["log_level"], names.SM_NUM_CPUS: env["num_cpus"],
        names.SM_NUM_GPUS: contract.num_gpus, names.SM_NUM_NEURONS: 0,
        names.SM_MODEL_DIR: str(p.model_dir), names.SM_INPUT_DIR: str(p.input_dir),
        names.SM_INPUT_DATA_DIR: str(p.input_data_dir),
        names.SM_INPUT_CONFIG_DIR: str(p.input_config_dir), names.SM_OUTPUT_DIR: str(p.output_dir),
        names.SM_OUTPUT_DATA_DIR: str(p.output_data_dir),
        names.SM_OUTPUT_INTERMEDIATE_DIR: str(p.output_intermediate_dir),
        names.SM_OUTPUT_FAILURE: str(p.failure_file), names.SM_CHANNELS: contract.channels,
        names.SM_MASTER_ADDR: contract.master_addr, names.SM_MASTER_PORT: contract.master_port,
        names.SM_CHECKPOINT_DIR: os.environ.get(names.SM_CHECKPOINT_DIR, str(p.checkpoints_dir)),
    }
    values.update(model_trainer_env(contract))
    for channel in contract.channels:
        values[env_name(names.SM_CHANNEL_PREFIX, channel)] = str(p.channel_dir(channel))
    for key, value in contract.hyperparameters.items():
        values[env_name(names.SM_HP_PREFIX, key)] = value
    return {key: env_value(value) for key, value in values.items()}


def model_trainer_env(contract: HostContract) -> dict[str, Any]:
    """What SDK v3's drivers export beyond the toolkit's variables (ModelTrainer jobs)."""
    settings = contract.model_trainer
    if settings is None:
        return {}
    values: dict[str, Any] = {names.SM_SOURCE_DIR: str(contract.code_dir),
                              names.SM_ENTRY_SCRIPT: contract.entry_point}
    if settings.get("distributed"):
        values[names.SM_DISTRIBUTED_CONFIG] = settings["distributed"]
    return values


def python_path(code_dir: Path) -> str:
    parts = [str(code_dir), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.pathsep.join(parts)


PYTHON = sys.executable
