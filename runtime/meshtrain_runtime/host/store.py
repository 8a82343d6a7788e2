"""torchrun's rendezvous store, served on the job's interface instead of every one.

torch's TCPStore server listens on every interface (``[::]``) whatever host name it is given,
and it has no authentication: whoever reaches its port reads and writes the job's rendezvous
keys. So on the first host of a static rendezvous the agent (agent_entry) starts the store's
server before torchrun does, on a socket bound to the address this host reaches the master at
(loopback for a local job; ``meshtrain.contract.network.service_address``), and torchrun's own
TCPStore, made with ``multi_tenant=True`` (static_tcp_rendezvous), shares that server instead
of opening one of its own. Were torchrun to stop sharing, its store would fail to bind the port
(address in use) rather than quietly listen everywhere.
"""

from __future__ import annotations

import socket
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from meshtrain.contract.network import service_address

LISTEN_BACKLOG = 2048
STORE_TIMEOUT = timedelta(seconds=300)  # the store's own client calls; the server never waits


@dataclass(frozen=True)
class StaticMaster:
    """Where torchrun's static rendezvous store will be served from this host."""

    address: str
    port: int


def _value(argv: list[str], flag: str) -> str | None:
    """The value after `flag` (``--flag value`` or ``--flag=value``; dashes or underscores)."""
    names = {flag, flag.replace("-", "_").replace("__", "--")}
    for index, item in enumerate(argv):
        name, equals, value = item.partition("=")
        if name in names:
            return value if equals else (argv[index + 1] if index + 1 < len(argv) else None)
    return None


def static_master(argv: list[str]) -> StaticMaster | None:
    """The store this agent's torchrun serves: node rank 0 of a static rendezvous with an
    explicit master address and port (what the bootstrap passes); None otherwise."""
    if _value(argv, "--rdzv-backend") not in (None, "static") or "--standalone" in argv:
        return None
    address, port = _value(argv, "--master-addr"), _value(argv, "--master-port")
    if not address or not port or (_value(argv, "--node-rank") or "0") != "0":
        return None
    return StaticMaster(address, int(port))


def serve_rendezvous_store(argv: list[str]) -> tuple[socket.socket, Any] | None:
    """Start the server of torchrun's store on this host's job interface; keep what it returns
    alive for the agent's whole life (the listening socket and the store that serves it).
    None where torchrun serves its own (another host is the master, an elastic rendezvous, or a
    master name that may resolve elsewhere on the other hosts)."""
    master = static_master(argv)
    if master is None:
        return None
    address = service_address(master.address)
    if address is None:
        return None
    import torch.distributed as dist

    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((address, master.port))
    listener.listen(LISTEN_BACKLOG)
    store = dist.TCPStore(master.address, master.port, None, True, STORE_TIMEOUT,
                          wait_for_workers=False, multi_tenant=True,
                          master_listen_fd=listener.fileno())
    return listener, store
