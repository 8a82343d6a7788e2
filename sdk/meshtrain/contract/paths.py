"""The /opt/ml tree of one host, rooted at an overridable base directory."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from meshtrain.contract.env import SAGEMAKER_BASE_DIR

DEFAULT_BASE_DIR = "/opt/ml"
DEFAULT_CHECKPOINT_DIR = "/opt/ml/checkpoints"


@dataclass(frozen=True)
class OptMLPaths:
    """Every path of the SageMaker training contract under `base` (normally /opt/ml)."""

    base: Path

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> OptMLPaths:
        env = os.environ if env is None else env
        return cls(Path(env.get(SAGEMAKER_BASE_DIR, DEFAULT_BASE_DIR)))

    @property
    def input_dir(self) -> Path:
        return self.base / "input"

    @property
    def input_config_dir(self) -> Path:
        return self.input_dir / "config"

    @property
    def input_data_dir(self) -> Path:
        return self.input_dir / "data"

    @property
    def hyperparameters_file(self) -> Path:
        return self.input_config_dir / "hyperparameters.json"

    @property
    def resource_config_file(self) -> Path:
        return self.input_config_dir / "resourceconfig.json"

    @property
    def input_data_config_file(self) -> Path:
        return self.input_config_dir / "inputdataconfig.json"

    @property
    def code_dir(self) -> Path:
        return self.base / "code"

    @property
    def model_dir(self) -> Path:
        return self.base / "model"

    @property
    def output_dir(self) -> Path:
        return self.base / "output"

    @property
    def output_data_dir(self) -> Path:
        return self.output_dir / "data"

    @property
    def tensorboard_dir(self) -> Path:
        """Where SageMaker's TensorBoardOutputConfig reads event files (its LocalPath default)."""
        return self.output_dir / "tensorboard"

    @property
    def output_intermediate_dir(self) -> Path:
        return self.output_dir / "intermediate"

    @property
    def failure_file(self) -> Path:
        return self.output_dir / "failure"

    @property
    def success_file(self) -> Path:
        return self.output_dir / "success"

    @property
    def checkpoints_dir(self) -> Path:
        return self.base / "checkpoints"

    def channel_dir(self, channel: str) -> Path:
        return self.input_data_dir / channel

    def make_dirs(self) -> None:
        for path in (self.input_config_dir, self.input_data_dir, self.code_dir, self.model_dir,
                     self.output_data_dir, self.output_intermediate_dir):
            path.mkdir(parents=True, exist_ok=True)
