"""meshtrain: a SageMaker-style training SDK with an open model-parallel runtime."""

from meshtrain.contract.errors import ConfigError, JobFailedError
from meshtrain.version import __version__

__all__ = ["ConfigError", "Estimator", "JobFailedError", "TrainingJob", "__version__"]


def __getattr__(name: str):
    # Lazy: `import meshtrain` stays cheap and free of side effects.
    if name == "Estimator":
        from meshtrain.estimator import Estimator

        return Estimator
    if name == "TrainingJob":
        from meshtrain.job import TrainingJob

        return TrainingJob
    raise AttributeError(f"module 'meshtrain' has no attribute {name!r}")
