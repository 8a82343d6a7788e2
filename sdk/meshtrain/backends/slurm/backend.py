"""Slurm backend (instance_type="slurm"): one sbatch job of `instance_count` nodes on the
cluster that `sbatch`/`SLURM_CONF` name; srun starts one host per node over the shared job
directory. With torch_distributed.fault_tolerance: one sbatch job per replica group and a
lighthouse run by the submitting side (ft_submit.py). Composes the host layer
(meshtrain.backends.hosts): job directory, /opt/ml trees, S3 staging, restarts, packing and the
handle. See docs/slurm.md.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

from meshtrain.backends.hosts.backend import HostBackend
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.replica_groups import replica_groups_of
from meshtrain.backends.slurm.commands import Partition, find_partition, require_sbatch
from meshtrain.backends.slurm.ft_submit import write_options
from meshtrain.backends.slurm.handle import SlurmTrainingJob
from meshtrain.backends.slurm.script import SlurmOptions, render
from meshtrain.backends.slurm.submit import BY_HAND, SCRIPT
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.private_files import make_private_dir

if TYPE_CHECKING:
    from meshtrain.targets import Target

OPTIONS = frozenset({"jobs_dir", "partition", "account", "qos", "constraint", "gpus_per_node",
                     "sbatch_args"})
"""The backend options Slurm jobs take (meshtrain.targets reads them from here)."""


class SlurmBackend(HostBackend):
    """Runs each job as one sbatch job; its directory under `jobs_dir` (a shared filesystem)."""

    name = "slurm"
    title = "Slurm"
    supports_fault_tolerance = True  # one sbatch job per replica group: ft_submit.py
    supervisor_module = "meshtrain.backends.slurm.submit"
    job_class = SlurmTrainingJob

    def __init__(self, target: Target | None = None, jobs_dir: str | Path | None = None,
                 partition: str | None = None, account: str | None = None,
                 qos: str | None = None, constraint: str | None = None,
                 gpus_per_node: int | None = None, sbatch_args: list[str] | None = None,
                 **_ignored: Any) -> None:
        super().__init__(target, jobs_dir)
        self.explicit_jobs_dir = jobs_dir is not None
        self.options = SlurmOptions(partition, account, qos, constraint, gpus_per_node or 0,
                                    list(sbatch_args or []))
        self.gpus_per_node = gpus_per_node
        self.by_hand = False

    def validate(self, spec: JobSpec) -> None:
        """jobs_dir, sbatch, the partition and its size: ConfigErrors before anything is made."""
        self._check_jobs_dir()
        if spec.checkpoint_local_path:
            _check_writable_dir(Path(spec.checkpoint_local_path).parent, "checkpoint_local_path")
        require_sbatch()
        partition = self._partition()
        if spec.instance_count > partition.nodes:
            raise ConfigError(
                f"instance_count={spec.instance_count} but Slurm partition {partition.name!r} "
                f"has {partition.nodes} node(s). Use instance_count <= {partition.nodes} or "
                "another partition.")
        if self.gpus_per_node is None:  # the partition's GPU GRES (0 on CPU nodes)
            self.options = SlurmOptions(**{**self.options.__dict__,
                                           "gpus_per_node": partition.gpus_per_node})
        super().validate(spec)

    def _partition(self) -> Partition:
        try:
            return find_partition(self.options.partition)
        except RuntimeError as error:  # sinfo could not reach slurmctld
            raise ConfigError(f"could not ask the Slurm cluster for its partitions ({error}). "
                              "Check that slurmctld is up and SLURM_CONF names it.") from None

    def _check_jobs_dir(self) -> None:
        if not self.explicit_jobs_dir:
            make_private_dir(self.jobs_dir, parents=True)
        _check_writable_dir(self.jobs_dir, "jobs_dir")

    def prepare_job(self, spec: JobSpec, job_dir: JobDirectory, token: str) -> None:
        if replica_groups_of(spec):  # the groups' scripts follow once the lighthouse listens
            write_options(job_dir, self.options)
            return
        (job_dir.root / SCRIPT).write_text(render(spec, job_dir, token, self.options,
                                                  carry_environment=self.by_hand))
        if self.by_hand:
            (job_dir.root / BY_HAND).touch()

    def render_job(self, spec: JobSpec) -> str:
        """Make the job directory as submit() does, but leave the sbatch to the user: the
        script's text (its copy is job.sbatch in the job directory)."""
        if replica_groups_of(spec):
            raise ConfigError(
                "torch_distributed.fault_tolerance cannot be rendered for sbatch by hand: the "
                "submitting side starts the lighthouse, then sbatches one job per replica group "
                "with its address. Submit it with fit() instead.")
        self.by_hand = True
        job = self.submit(spec)
        return (job.job_dir.root / SCRIPT).read_text()

    def starting_message(self, spec: JobSpec) -> str:
        where = self.options.partition or "the default partition"
        groups = replica_groups_of(spec)
        if groups:
            return (f"Submitting {spec.instance_count} node(s) to Slurm ({where}) as "
                    f"{groups} jobs, one per replica group")
        return f"Submitting {spec.instance_count} node(s) to Slurm ({where})"

    def not_found(self, job_name: str) -> str:
        return f"no Slurm job {job_name} under {self.jobs_dir}"


def _check_writable_dir(path: Path, option: str) -> None:
    """`path` is a directory this user can write: ConfigError naming the fix otherwise."""
    if not path.is_dir():
        raise ConfigError(f"{option}: {path} does not exist. Create it on the cluster's shared "
                          "filesystem (every node must see it), or pass another one.")
    if not os.access(path, os.W_OK | os.X_OK):
        raise ConfigError(f"{option}: {path} cannot be written by this user. Choose a "
                          "directory you can write on the cluster's shared filesystem.")
