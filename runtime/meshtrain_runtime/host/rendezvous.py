"""How this host's torchrun meets the others.

Static (every target's default): ``--nnodes N --node-rank i --master-addr algo-1``, so algo-1
holds rank 0 as on SageMaker. Elastic: when the host's environment names a rendezvous backend the
way torchrun's own ``PET_*`` variables do (a Kubeflow PyTorchJob with an ``elasticPolicy`` sets
``PET_RDZV_BACKEND``, ``PET_RDZV_ENDPOINT``, ``PET_NNODES`` and ``PET_MAX_RESTARTS``), torchrun
joins an etcd (``etcd``/``etcd-v2``, a v2 API server) or ``c10d`` rendezvous instead; node ranks
then follow arrival order. Either way the address to meet at must resolve first: in a cluster a
peer's DNS name appears only once its pod exists, so the bootstrap waits for it (up to
``MESHTRAIN_RDZV_WAIT_SECONDS``) and fails with the name and the wait if it never does.
"""

from __future__ import annotations

import os
import socket
import time
from collections.abc import Callable, Mapping

from meshtrain.contract.env import MESHTRAIN_ATTEMPT
from meshtrain.contract.errors import ConfigError

ELASTIC_BACKENDS = ("c10d", "etcd", "etcd-v2")
WAIT_SECONDS_ENV = "MESHTRAIN_RDZV_WAIT_SECONDS"
DEFAULT_WAIT_SECONDS = 300.0


class RendezvousError(RuntimeError):
    """The address the hosts meet at never resolved."""


def elastic_arguments(env: Mapping[str, str], job_name: str,
                      num_hosts: int) -> list[str] | None:
    """torchrun's rendezvous arguments from ``PET_*``, or None for a static rendezvous."""
    backend = env.get("PET_RDZV_BACKEND", "").strip()
    if not backend or backend == "static":
        return None
    if backend not in ELASTIC_BACKENDS:
        raise ConfigError(f"PET_RDZV_BACKEND={backend!r} is not a rendezvous meshtrain runs: "
                          f"use one of {', '.join(ELASTIC_BACKENDS)} (or unset it for static).")
    endpoint = env.get("PET_RDZV_ENDPOINT", "").strip()
    if not endpoint:
        raise ConfigError(f"PET_RDZV_BACKEND={backend!r} needs PET_RDZV_ENDPOINT (host:port of "
                          "the etcd server, or of the c10d store's host).")
    run_id = env.get("PET_RDZV_ID") or job_name or "meshtrain"
    attempt = env.get(MESHTRAIN_ATTEMPT, "1")
    if attempt.isdigit() and int(attempt) > 1:  # a restarted local job meets afresh
        run_id = f"{run_id}-attempt-{attempt}"
    return ["--rdzv-backend", backend, "--rdzv-endpoint", endpoint,
            "--rdzv-id", run_id,
            "--nnodes", env.get("PET_NNODES") or str(num_hosts),
            "--max-restarts", env.get("PET_MAX_RESTARTS") or "0"]


def endpoint_host(arguments: list[str] | None, master_addr: str) -> str:
    """The host name this host must reach to join: the rendezvous endpoint's, or the master's."""
    if arguments is None:
        return master_addr
    endpoint = arguments[arguments.index("--rdzv-endpoint") + 1]
    return endpoint.rsplit(":", 1)[0] if ":" in endpoint else endpoint


def wait_until_resolvable(host: str, *, seconds: float | None = None,
                          resolve: Callable[[str], object] = socket.gethostbyname,
                          sleep: Callable[[float], None] = time.sleep,
                          clock: Callable[[], float] = time.monotonic) -> None:
    """Return once `host` resolves; RendezvousError after `seconds` (retrying every second)."""
    if seconds is None:
        seconds = float(os.environ.get(WAIT_SECONDS_ENV) or DEFAULT_WAIT_SECONDS)
    deadline = clock() + seconds
    while True:
        try:
            resolve(host)
            return
        except OSError as error:
            if clock() >= deadline:
                raise RendezvousError(
                    f"the rendezvous address {host!r} did not resolve within {seconds:.0f} s "
                    f"({error}); its pod or host may not have started. Raise "
                    f"{WAIT_SECONDS_ENV} or check the job's first host.") from None
        sleep(1.0)
