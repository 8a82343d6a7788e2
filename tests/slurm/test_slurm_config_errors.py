"""Bad Slurm inputs are ConfigErrors before anything is submitted or made, naming the fix
(the partitions and node counts come from the real test cluster's sinfo)."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from meshtrain import Estimator
from meshtrain.backends.slurm.commands import gpus_of
from meshtrain.contract.errors import ConfigError

pytestmark = pytest.mark.slurm
QUICKSTART = Path(__file__).resolve().parents[2] / "examples" / "quickstart"


def estimator(jobs_dir, instance_count: int = 2, **options) -> Estimator:
    return Estimator(entry_point="train.py", source_dir=str(QUICKSTART),
                     instance_type="slurm", instance_count=instance_count,
                     jobs_dir=str(jobs_dir), **options)


def refused(jobs_dir, **kwargs) -> str:
    """fit()'s ConfigError, after checking that nothing was made or queued."""
    with pytest.raises(ConfigError) as error:
        estimator(jobs_dir, **kwargs).fit(wait=False)
    if jobs_dir.is_dir() and str(jobs_dir).startswith("/tmp"):
        assert list(jobs_dir.iterdir()) == []
    queued = subprocess.run(["squeue", "-h"], capture_output=True, text=True).stdout
    assert queued.strip() == ""
    return str(error.value)


def test_an_unknown_partition_lists_the_clusters_partitions(slurm_cluster, tmp_path):
    message = refused(tmp_path, partition="gpu-huge")
    assert "partition='gpu-huge'" in message and "debug" in message


def test_more_nodes_than_the_partition_has(slurm_cluster, tmp_path):
    message = refused(tmp_path, instance_count=3)
    assert "instance_count=3" in message and "has 2 node(s)" in message
    assert "instance_count <= 2" in message


def test_a_jobs_dir_that_does_not_exist_or_cannot_be_written(slurm_cluster, tmp_path):
    missing = tmp_path / "not-made"
    assert "does not exist" in refused(missing)
    assert not missing.exists()
    # procfs refuses writes even to root, so this holds for any user
    message = refused(Path("/proc/sys"))
    assert "jobs_dir" in message and "not writable" in message


def test_no_sbatch_on_path(tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path / "empty-bin"))
    with pytest.raises(ConfigError) as error:
        estimator(tmp_path, instance_count=1).fit(wait=False)
    message = str(error.value)
    assert "sbatch" in message and "PATH" in message
    assert list(tmp_path.iterdir()) == []


def test_gpus_per_node_defaults_to_the_partitions_gpu_gres(slurm_cluster, tmp_path):
    assert [gpus_of(g) for g in ("gpu:4", "gpu:a100:8(S:0-1)", "(null)", "")] == [4, 8, 0, 0]
    est = estimator(tmp_path)
    backend = est.backend
    backend.validate(est.build_spec(job_name="gpus"))
    assert backend.options.gpus_per_node == 0  # the test cluster's nodes are CPU nodes
