"""Where torchft's servers in a rank listen: on the job's interface, not on every interface.

torchft 0.2 binds its Manager server to ``[::]`` and its healing transport (an HTTP server that
hands this group's model and optimizer state to a recovering peer, with no authentication) to
every interface, and advertises ``socket.gethostname()``; neither takes an address. So while
build_manager makes the Manager, `manager_bound_to` wraps the Manager server class torchft's
manager module calls, and `bound_http_transport` is an HTTPTransport whose server class binds
the address and whose advertised address is that address. Both lean on torchft's module-level
names (``torchft.manager.ManagerServer``, ``torchft.checkpointing.http_transport.
_IPv6HTTPServer``) and check that they were used: a torchft that moved them fails with a
RuntimeError rather than listening everywhere (tests/runtime/test_fault_binding.py).
"""

from __future__ import annotations

import contextlib
import os
import socket
from collections.abc import Iterator
from datetime import timedelta
from http.server import ThreadingHTTPServer
from typing import Any

from meshtrain.contract.network import service_address, url_host

REQUEST_QUEUE = 1024  # torchft's own server's backlog
PINNED = "meshtrain binds it for torchft 0.2.0 (pip install 'torchft==0.2.0')"


def job_service_address() -> str | None:
    """The address this rank's torchft servers listen on: the one this host reaches its
    group's rendezvous master at (loopback for a local job); None leaves torchft's default."""
    return service_address(os.environ["MASTER_ADDR"])


@contextlib.contextmanager
def manager_bound_to(address: str | None, group_rank: int) -> Iterator[None]:
    """While the Manager is made, its server (group rank 0's) binds `address`, keeping the
    port torchft picks. RuntimeError when rank 0's Manager made no server through the name."""
    if address is None:
        yield
        return
    import torchft.manager as manager_module

    original = getattr(manager_module, "ManagerServer", None)
    if original is None:
        raise RuntimeError(f"torchft.manager has no ManagerServer: {PINNED}.")
    used: list[str] = []

    def bound(*args: Any, **kwargs: Any) -> Any:
        port = str(kwargs.get("bind", ":0")).rsplit(":", 1)[-1]
        kwargs["bind"] = f"{url_host(address)}:{port}"
        used.append(kwargs["bind"])
        return original(*args, **kwargs)

    manager_module.ManagerServer = bound
    try:
        yield
    finally:
        manager_module.ManagerServer = original
    if group_rank == 0 and not used:
        raise RuntimeError(f"torchft's Manager no longer makes its server through "
                           f"torchft.manager.ManagerServer: {PINNED}.")


def made_bound(factory: Any, address: str | None, group_rank: int) -> Any:
    """`factory` (torchft's Manager) called within `manager_bound_to`."""
    def make(*args: Any, **kwargs: Any) -> Any:
        with manager_bound_to(address, group_rank):
            return factory(*args, **kwargs)
    return make


def bound_http_transport(address: str | None, timeout: timedelta) -> Any:
    """torchft's HTTPTransport (what the Manager makes by default: ``num_chunks=0``) whose
    server listens on `address` and whose advertised address is that address; None leaves
    the Manager its default transport."""
    if address is None:
        return None
    from torchft.checkpointing import http_transport as module

    if not hasattr(module, "_IPv6HTTPServer"):
        raise RuntimeError(f"torchft's HTTPTransport no longer builds its server through "
                           f"_IPv6HTTPServer: {PINNED}.")
    ports: list[int] = []

    class BoundServer(ThreadingHTTPServer):
        address_family = socket.AF_INET6 if ":" in address else socket.AF_INET
        request_queue_size = REQUEST_QUEUE

        def __init__(self, _every_interface: Any, handler: Any) -> None:
            super().__init__((address, 0), handler)
            ports.append(self.server_address[1])

    class BoundHTTPTransport(module.HTTPTransport):
        def address(self) -> str:
            return f"http://{url_host(address)}:{ports[0]}/checkpoint/"

    original = module._IPv6HTTPServer
    module._IPv6HTTPServer = BoundServer
    try:
        transport = BoundHTTPTransport(timeout=timeout, num_chunks=0)
    finally:
        module._IPv6HTTPServer = original
    if not ports:
        transport.shutdown(wait=False)
        raise RuntimeError(f"torchft's HTTPTransport did not build its server through "
                           f"_IPv6HTTPServer: {PINNED}.")
    return transport
