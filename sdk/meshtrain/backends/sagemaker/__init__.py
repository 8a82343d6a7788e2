"""Amazon SageMaker through boto3: checks -> request -> CreateTrainingJob, then a job handle."""

from meshtrain.backends.sagemaker.backend import SageMakerBackend
from meshtrain.backends.sagemaker.job import SageMakerTrainingJob

__all__ = ["SageMakerBackend", "SageMakerTrainingJob"]
