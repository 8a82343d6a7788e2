"""fault/binding.py: torchft's healing transport and Manager server listen on the address they
are given (and advertise it), not on every interface; a torchft that no longer builds them
through the names meshtrain wraps is a RuntimeError, never a silent listen everywhere."""

from __future__ import annotations

import os
from datetime import timedelta

import pytest
from ci_guards import import_or_skip
from job_privacy import listeners

from meshtrain_runtime.fault.binding import bound_http_transport, made_bound, manager_bound_to

torch = import_or_skip("torch")
torchft = import_or_skip("torchft")
TIMEOUT = timedelta(seconds=30)


def own_listening(port: int) -> list[tuple[str, int]]:
    return [(s.address, s.port) for s in listeners([os.getpid()]) if s.port == port]


def test_the_healing_transport_serves_a_peer_from_loopback_only():
    from torchft.checkpointing.http_transport import HTTPTransport

    sender = bound_http_transport("127.0.0.1", TIMEOUT)
    receiver = HTTPTransport(timeout=TIMEOUT, num_chunks=0)
    try:
        address = sender.metadata()
        assert address.startswith("http://127.0.0.1:") and address.endswith("/checkpoint/")
        port = int(address.split(":")[2].split("/")[0])
        assert own_listening(port) == [("127.0.0.1", port)]
        state = {"weight": torch.arange(6.0)}
        sender.send_checkpoint(dst_ranks=[1], step=4, state_dict=state, timeout=TIMEOUT)
        got = receiver.recv_checkpoint(src_rank=0, metadata=address, step=4, timeout=TIMEOUT)
        assert torch.equal(got["weight"], state["weight"])
    finally:
        sender.shutdown(wait=False)
        receiver.shutdown(wait=False)


def test_without_an_address_the_manager_keeps_its_default_transport():
    assert bound_http_transport(None, TIMEOUT) is None


def test_a_transport_that_moved_its_server_class_is_refused(monkeypatch):
    from torchft.checkpointing import http_transport

    monkeypatch.delattr(http_transport, "_IPv6HTTPServer")
    with pytest.raises(RuntimeError, match="no longer builds its server through"):
        bound_http_transport("127.0.0.1", TIMEOUT)


def test_the_manager_server_listens_on_loopback():
    from torchft._torchft import LighthouseServer

    lighthouse = LighthouseServer(bind="127.0.0.1:0", min_replicas=1)
    import torchft.manager as manager_module

    try:
        with manager_bound_to("127.0.0.1", group_rank=0):
            server = manager_module.ManagerServer(
                replica_id="binding-test", lighthouse_addr=lighthouse.address(),
                hostname="127.0.0.1", bind="[::]:0", store_addr="127.0.0.1:1", world_size=1,
                heartbeat_interval=timedelta(milliseconds=100), connect_timeout=TIMEOUT,
                quorum_retries=0)
        port = int(server.address().rsplit(":", 1)[1])
        assert own_listening(port) == [("127.0.0.1", port)]
        server.shutdown()
    finally:
        lighthouse.shutdown()


def test_a_manager_that_made_no_server_through_the_wrapper_is_refused():
    with pytest.raises(RuntimeError, match="no longer makes its server through"):
        made_bound(lambda: "a manager that made its own server", "127.0.0.1", 0)()
    assert made_bound(lambda: "rank 1 only connects", "127.0.0.1", 1)() == (
        "rank 1 only connects")
