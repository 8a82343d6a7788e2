"""Slurm: one sbatch job per training job, one host per node, over a shared job directory."""

from meshtrain.backends.slurm.backend import SlurmBackend
from meshtrain.backends.slurm.handle import SlurmTrainingJob

__all__ = ["SlurmBackend", "SlurmTrainingJob"]
