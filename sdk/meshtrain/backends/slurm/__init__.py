"""Slurm: one sbatch job per training job, one host per node, over a shared job directory
(meshtrain.backends.slurm.backend; nothing is imported here, so the CLI's `slurm` command and
the target table stay cheap to load)."""
