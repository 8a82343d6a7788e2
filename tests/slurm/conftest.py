"""The Slurm tier's cluster: one real two-node cluster for the whole tier (each start costs
seconds; jobs share it, one xdist worker runs the tier: tests/conftest.py's SHARED_RESOURCES)."""

from __future__ import annotations

import os

import pytest
from ci_guards import missing_component
from slurm_cluster import ClusterError, SlurmCluster, missing_binaries


@pytest.fixture(scope="session")
def slurm_cluster(tmp_path_factory):
    """A started cluster; SLURM_CONF and PATH point every Slurm command of the test at it."""
    missing = missing_binaries()
    if missing:
        missing_component(f"Slurm: {', '.join(missing)} not installed (apt-get install "
                          "slurm-wlm munge)")
    if os.geteuid() != 0:
        missing_component("Slurm's daemons here run as root (SlurmUser=root); not root")
    cluster = SlurmCluster(tmp_path_factory.mktemp("slurm"))
    try:
        cluster.start()
    except ClusterError as error:
        cluster.stop()
        pytest.fail(f"the Slurm test cluster did not start: {error}", pytrace=False)
    old = os.environ.get("SLURM_CONF")
    os.environ["SLURM_CONF"] = str(cluster.conf)
    yield cluster
    if old is None:
        os.environ.pop("SLURM_CONF", None)
    else:
        os.environ["SLURM_CONF"] = old
    cluster.stop()
