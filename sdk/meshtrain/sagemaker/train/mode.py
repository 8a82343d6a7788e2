"""SDK v3's `Mode`: where `ModelTrainer.train()` runs (importable from `model_trainer` too)."""

from __future__ import annotations

from enum import Enum


class Mode(Enum):
    """Where `train()` runs the job: SageMaker (or the target `compute` names), or local
    containers (meshtrain's local Docker backend)."""

    LOCAL_CONTAINER = "LOCAL_CONTAINER"
    SAGEMAKER_TRAINING_JOB = "SAGEMAKER_TRAINING_JOB"
