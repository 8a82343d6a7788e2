"""Asking the Slurm cluster (the one `sbatch`/`SLURM_CONF` name) what it has: partitions, nodes,
GPUs, and the state of a job. Plain subprocess calls of Slurm's own commands."""

from __future__ import annotations

import re
import shutil
import subprocess
from dataclasses import dataclass
from datetime import datetime

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.network import service_address

TIMEOUT_SECONDS = 30
ENDED_STATES = frozenset({"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL",
                          "OUT_OF_MEMORY", "PREEMPTED", "BOOT_FAIL", "DEADLINE"})
"""Job states after which Slurm runs nothing more of the job (a requeued job goes PENDING)."""
_GPU_GRES = re.compile(r"gpu(?::[^:,(]+)?:(\d+)")


def require_sbatch() -> str:
    """sbatch's path; ConfigError naming the fix when it is not on PATH."""
    path = shutil.which("sbatch")
    if path is None:
        raise ConfigError("instance_type='slurm' needs Slurm's sbatch on PATH, and it is not "
                          "there. Run from a machine of the cluster (a login node) or add Slurm's "
                          "bin directory to PATH.")
    return path


def run_slurm(*argv: str) -> str:
    """stdout of a Slurm command; RuntimeError with its stderr when it fails."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=TIMEOUT_SECONDS,
                              stdin=subprocess.DEVNULL)
    except (OSError, subprocess.TimeoutExpired) as error:  # not installed here, or hung
        raise RuntimeError(f"{argv[0]} could not run: {error}") from None
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed: {done.stderr.strip() or done.stdout}")
    return done.stdout


@dataclass(frozen=True)
class Partition:
    """A partition as sinfo reports it."""

    name: str
    nodes: int
    gpus_per_node: int
    default: bool


def gpus_of(gres: str) -> int:
    """GPUs per node in a GRES string ("gpu:4", "gpu:a100:8(S:0-1)", "(null)": 0)."""
    found = _GPU_GRES.findall(gres)
    return max((int(count) for count in found), default=0)


def partitions() -> list[Partition]:
    """Every partition of the cluster (sinfo)."""
    rows: dict[str, Partition] = {}
    for line in run_slurm("sinfo", "-h", "-o", "%P|%D|%G").splitlines():
        if line.count("|") != 2:
            continue
        name, nodes, gres = line.split("|")
        default = name.endswith("*")
        name = name.rstrip("*")
        seen = rows.get(name)
        count = int(nodes) + (seen.nodes if seen else 0)  # one line per node state
        gpus = max(gpus_of(gres), seen.gpus_per_node if seen else 0)
        rows[name] = Partition(name, count, gpus, default or bool(seen and seen.default))
    return list(rows.values())


def find_partition(name: str | None) -> Partition:
    """The partition called `name` (None: the cluster's default); ConfigError listing them."""
    known = partitions()
    for partition in known:
        if partition.name == name or (name is None and partition.default):
            return partition
    listed = ", ".join(p.name for p in known) or "none"
    if name is None:
        raise ConfigError(f"the Slurm cluster has no default partition (partitions: {listed}). "
                          "Pass partition=... to the Estimator.")
    raise ConfigError(f"partition={name!r} is not a partition of this Slurm cluster "
                      f"(partitions: {listed}). Pass one of those, or check SLURM_CONF.")


def job_fields(slurm_job_id: str) -> dict[str, str]:
    """`scontrol show job` as a dict ({} when Slurm no longer knows the job); RuntimeError
    when Slurm cannot be asked (slurmctld down, no scontrol here)."""
    try:
        text = run_slurm("scontrol", "show", "job", "-o", slurm_job_id)
    except RuntimeError as error:
        if "Invalid job id" in str(error):
            return {}
        raise
    fields = {}
    for item in text.split():
        key, _, value = item.partition("=")
        fields.setdefault(key, value)
    return fields


def job_state(slurm_job_id: str) -> str:
    """PENDING, RUNNING, COMPLETED, ... ('' when Slurm no longer knows or cannot say)."""
    try:
        return job_fields(slurm_job_id).get("JobState", "")
    except RuntimeError:
        return ""


def node_address(node: str) -> str:
    """The address other nodes reach `node` at (its NodeAddr)."""
    text = run_slurm("scontrol", "show", "node", "-o", node)
    match = re.search(r"NodeAddr=(\S+)", text)
    return match.group(1) if match else node


def expand_nodelist(nodelist: str) -> list[str]:
    """n[1-2] -> [n1, n2] (scontrol show hostnames)."""
    return run_slurm("scontrol", "show", "hostnames", nodelist).split()


def slurmd_started(node: str) -> datetime | None:
    """When `node`'s slurmd last started (SlurmdStartTime, the cluster's local time)."""
    try:
        text = run_slurm("scontrol", "show", "node", "-o", node)
    except RuntimeError:
        return None
    match = re.search(r"SlurmdStartTime=(\S+)", text)
    try:
        return datetime.fromisoformat(match.group(1)) if match else None
    except ValueError:  # "None" or "Unknown"
        return None


def address_towards_nodes(partition: str | None) -> str | None:
    """This host's address on the network the partition's nodes reach it through (the route
    towards its first node's NodeAddr): what a service the submitting side runs for the job
    binds to, rather than every interface. None (every interface) where that cannot be told:
    Slurm does not answer (its sbatch fails next, with Slurm's words), or the node's name
    resolves to loopback here (contract/network.py)."""
    try:
        listed = run_slurm("sinfo", "-h", "-o", "%N", *(["-p", partition] if partition else []))
        first = expand_nodelist(listed.split()[0])[0]
        return service_address(node_address(first))
    except (RuntimeError, OSError, IndexError):
        return None
