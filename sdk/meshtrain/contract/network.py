"""Where a job's services listen: no wider than the hosts need.

A local job's hosts meet on loopback, so everything it starts (torchrun's rendezvous store,
torchft's lighthouse, Manager server and healing transport, gloo's pairs) listens there. A
multi-host job's services listen on the one interface the hosts reach each other through: the
address this host routes from towards the job's rendezvous master (or, on the submitting side of
a Slurm job, towards a compute node). torch's TCPStore and torchft's servers have no
authentication, which is why this matters (docs/security.md).
"""

from __future__ import annotations

import ipaddress
import socket

LOOPBACK = "127.0.0.1"
LOOPBACK_INTERFACE = "lo"
"""Linux's loopback interface, for libraries that take an interface name (gloo, NCCL)."""
PROBE_PORT = 9  # any port: a UDP connect sends nothing, it only picks the route


def local_address_towards(peer: str) -> str:
    """The address of this host's interface that reaches `peer` (a name or an IPv4 address):
    loopback for a loopback peer, this host's own address when `peer` is this host."""
    address = socket.gethostbyname(peer)
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((address, PROBE_PORT))
        return probe.getsockname()[0]


def service_address(master: str) -> str | None:
    """Where this host's job services listen: the address it reaches the job's `master` at.
    None (torch's and torchft's default: every interface) when `master` is a name that resolves
    to loopback here but may not on the other hosts (Debian maps a machine's own name to
    127.0.1.1): binding loopback would shut them out. A literal loopback master (a local job)
    gives loopback."""
    address = local_address_towards(master)
    if ipaddress.ip_address(address).is_loopback and not _is_loopback_literal(master):
        return None
    return address


def _is_loopback_literal(text: str) -> bool:
    try:
        return ipaddress.ip_address(text).is_loopback
    except ValueError:
        return False


def url_host(address: str) -> str:
    """`address` as the host part of a URL (an IPv6 address in brackets)."""
    return f"[{address}]" if ":" in address else address
