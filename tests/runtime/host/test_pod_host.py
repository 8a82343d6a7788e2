"""A Kubernetes pod's host name, from the env its rendered manifest gives it."""

from __future__ import annotations

import pytest

from meshtrain_runtime.host.contract import pod_host


@pytest.mark.parametrize("env, host", [
    ({"MESHTRAIN_REPLICA_TYPE": "master", "MESHTRAIN_REPLICA_INDEX": "0"}, "algo-1"),
    ({"MESHTRAIN_REPLICA_TYPE": "worker", "MESHTRAIN_REPLICA_INDEX": "0"}, "algo-2"),
    ({"MESHTRAIN_REPLICA_TYPE": "Worker", "MESHTRAIN_REPLICA_INDEX": "6"}, "algo-8"),
    ({"MESHTRAIN_NODE_RANK": "3"}, "algo-4"),
    ({}, None),
])
def test_pod_host(monkeypatch, env, host):
    for name in ("MESHTRAIN_REPLICA_TYPE", "MESHTRAIN_REPLICA_INDEX", "MESHTRAIN_NODE_RANK"):
        monkeypatch.delenv(name, raising=False)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    assert pod_host() == host


def test_a_replica_type_that_is_not_master_or_worker_fails_loudly(monkeypatch):
    monkeypatch.delenv("MESHTRAIN_NODE_RANK", raising=False)
    monkeypatch.setenv("MESHTRAIN_REPLICA_TYPE", "chief")
    monkeypatch.setenv("MESHTRAIN_REPLICA_INDEX", "0")
    with pytest.raises(ValueError, match="not a PyTorchJob replica"):
        pod_host()
