"""host.store: on a static rendezvous's first host the agent serves torchrun's TCPStore on the
job's interface; torchrun's own store (multi_tenant, as static_tcp_rendezvous makes it) shares
that server instead of listening on every interface, as a TCPStore alone does."""

from __future__ import annotations

import os
import socket
from datetime import timedelta

import pytest
from ci_guards import import_or_skip
from job_privacy import listeners

from meshtrain_runtime.host.store import StaticMaster, serve_rendezvous_store, static_master

dist = import_or_skip("torch.distributed")
TIMEOUT = timedelta(seconds=30)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def own_listeners(port: int) -> list:
    return [s for s in listeners([os.getpid()]) if s.port == port]


@pytest.mark.parametrize("argv, expected", [
    (["--nnodes", "2", "--master-addr", "127.0.0.1", "--master-port", "29500",
      "--node-rank", "0"], StaticMaster("127.0.0.1", 29500)),
    (["--master_addr=algo-1", "--master_port=7777"], StaticMaster("algo-1", 7777)),
    (["--master-addr", "127.0.0.1", "--master-port", "29500", "--node-rank", "1"], None),
    (["--rdzv-backend", "c10d", "--rdzv-endpoint", "algo-1:29400"], None),
    (["--standalone", "--nproc-per-node", "2"], None),
    (["--nnodes", "1", "--nproc-per-node", "2"], None),  # torchrun picks its own port
])
def test_which_agents_serve_the_store(argv, expected):
    assert static_master(argv) == expected


def test_a_store_alone_listens_on_every_interface():
    """Why store.py exists: TCPStore's server ignores the host name it is given."""
    port = free_port()
    store = dist.TCPStore("127.0.0.1", port, 1, True, TIMEOUT)
    assert [s.loopback for s in own_listeners(port)] == [False]
    del store


def test_torchruns_store_shares_the_loopback_server():
    port = free_port()
    served = serve_rendezvous_store(["--nnodes", "2", "--master-addr", "127.0.0.1",
                                     "--master-port", str(port), "--node-rank", "0"])
    assert served is not None
    torchrun_store = dist.TCPStore("127.0.0.1", port, 1, True, TIMEOUT, multi_tenant=True)
    client = dist.TCPStore("127.0.0.1", port, 1, False, TIMEOUT)
    torchrun_store.set("key", "value")
    assert client.get("key") == b"value"
    assert [(s.address, s.port) for s in own_listeners(port)] == [("127.0.0.1", port)]
    del torchrun_store, client, served


def test_a_master_name_that_may_resolve_elsewhere_is_left_to_torchrun():
    assert serve_rendezvous_store(["--master-addr", "localhost", "--master-port", "29511",
                                   "--node-rank", "0"]) is None
