"""The sbatch script of a Slurm job: one job of `instance_count` nodes whose batch step runs
meshtrain.backends.slurm.batch on the first node (which srun's one host per node).

The same text is what `meshtrain slurm render` prints: it runs unchanged with `sbatch`.
"""

from __future__ import annotations

import math
import shlex
import sys
from dataclasses import dataclass, field

from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.contract import env as names
from meshtrain.contract import job_environment
from meshtrain.contract.job_environment import MESHTRAIN_JOB_ENVIRONMENT
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.private_files import PRIVATE_UMASK

PRIVATE_FILES_LINE = f"umask {PRIVATE_UMASK:03o}  # the job's files are its owner's alone"


@dataclass(frozen=True)
class SlurmOptions:
    """The Slurm job's own settings (the backend options of instance_type='slurm')."""

    partition: str | None = None
    account: str | None = None
    qos: str | None = None
    constraint: str | None = None
    gpus_per_node: int = 0
    sbatch_args: list[str] = field(default_factory=list)


def minutes(seconds: int) -> int:
    """max_run as sbatch's --time (whole minutes, rounded up)."""
    return max(1, math.ceil(seconds / 60))


def directives(spec: JobSpec, job_dir: JobDirectory, options: SlurmOptions) -> list[str]:
    flags = [f"--job-name={spec.job_name}", f"--nodes={spec.instance_count}",
             "--ntasks-per-node=1", f"--time={minutes(spec.max_run)}",
             f"--output={job_dir.root}/slurm-%j.out", "--requeue"]
    for name in ("partition", "account", "qos", "constraint"):
        value = getattr(options, name)
        if value:
            flags.append(f"--{name}={value}")
    if options.gpus_per_node:
        flags.append(f"--gpus-per-node={options.gpus_per_node}")
    flags += list(options.sbatch_args)
    return [f"#SBATCH {flag}" for flag in flags]


def render(spec: JobSpec, job_dir: JobDirectory, token: str, options: SlurmOptions,
           carry_environment: bool = False) -> str:
    """The whole sbatch script of the job whose directory is `job_dir`. The environment's
    values reach the job through sbatch's own environment (its default --export=ALL); a script
    rendered for sbatch by hand (`carry_environment`) carries them itself."""
    exports = {names.MESHTRAIN_JOB_NAME: spec.job_name, names.MESHTRAIN_JOB_TOKEN: token,
               names.MESHTRAIN_NUM_GPUS: str(options.gpus_per_node)}
    if carry_environment:
        exports[MESHTRAIN_JOB_ENVIRONMENT] = job_environment.encode(spec.environment)
    lines = ["#!/bin/bash", *directives(spec, job_dir, options),
             f"# meshtrain job {spec.job_name}: {spec.instance_count} node(s), hosts "
             f"{', '.join(spec.hosts)} in node order; see {job_dir.root}",
             PRIVATE_FILES_LINE,
             *[f"export {key}={shlex.quote(value)}" for key, value in exports.items()],
             f"exec {shlex.quote(sys.executable)} -m meshtrain.backends.slurm.batch "
             f"{shlex.quote(str(job_dir.root))}"]
    return "\n".join(lines) + "\n"


def group_script_name(group: int) -> str:
    """The sbatch script of replica group `group` of a fault-tolerant job."""
    return f"group-{group}.sbatch"


def render_group(spec: JobSpec, job_dir: JobDirectory, token: str, options: SlurmOptions,
                 group: int, hosts: tuple[str, ...], ft_env: dict[str, str]) -> str:
    """The sbatch script of one replica group of a fault-tolerant job: a job of its own over
    the group's hosts (requeued by Slurm alone when one of its nodes dies), its batch step told
    its group, the lighthouse and the option's settings (`ft_env`), and its own rendezvous."""
    exports = {names.MESHTRAIN_JOB_NAME: spec.job_name, names.MESHTRAIN_JOB_TOKEN: token,
               names.MESHTRAIN_NUM_GPUS: str(options.gpus_per_node), **ft_env}
    flags = [line for line in directives(spec, job_dir, options)
             if not line.startswith(("#SBATCH --job-name=", "#SBATCH --nodes="))]
    lines = ["#!/bin/bash", f"#SBATCH --job-name={spec.job_name}-group-{group}",
             f"#SBATCH --nodes={len(hosts)}", *flags,
             f"# meshtrain job {spec.job_name}, replica group {group}: hosts {', '.join(hosts)} "
             f"in node order; see {job_dir.root}",
             PRIVATE_FILES_LINE,
             *[f"export {key}={shlex.quote(value)}" for key, value in exports.items()],
             f"exec {shlex.quote(sys.executable)} -m meshtrain.backends.slurm.batch "
             f"{shlex.quote(str(job_dir.root))} {group}"]
    return "\n".join(lines) + "\n"
