"""The torchft lighthouse of one fault-tolerant job: started by the backend, stopped by its pid.

The lighthouse is torchft's quorum server: every replica group's manager heartbeats it and asks it
for each step's quorum. It runs torchft's own lighthouse function (what its ``torchft_lighthouse``
command calls) through lighthouse_entry.py, which skips the import of torch, with this job's
Python, in a session of its own and with the job's token in its environment, so the job's sweeps
reach it too. Its arguments are the contract's (``lighthouse_arguments``: ``--min_replicas`` is
``fault_tolerance.min_replica_groups``, 1 by default, so survivors keep stepping while a group is
down; the join and heartbeat timeouts say why they are what they are). Its output goes to
``lighthouse.log`` in the job directory; a lighthouse that exits or does not say where it
listens within START_TIMEOUT_SECONDS is an error that carries that log.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import FaultTolerance, lighthouse_arguments
from meshtrain.contract.network import LOOPBACK, url_host
from meshtrain.contract.private_files import PRIVATE_UMASK

ENTRY_SCRIPT = Path(__file__).with_name("lighthouse_entry.py")
START_TIMEOUT_SECONDS = 60.0
STOP_SECONDS = 5.0
LISTENING = re.compile(r"Lighthouse listening on: https?://\S+?:(\d+)\s*$", re.MULTILINE)
INSTALL_HINT = ("install torchft 0.2.0 beside meshtrain (pip install 'meshtrain[ft]' or "
                "'torchft==0.2.0'; Linux x86_64 wheels only)")


class LighthouseError(RuntimeError):
    """The lighthouse did not start; the message carries its log."""


def check_lighthouse_installed(where: str) -> None:
    """ConfigError (before anything exists) where the lighthouse cannot run."""
    if importlib.util.find_spec("torchft") is None:  # finds it without importing it
        raise ConfigError(f"torch_distributed.fault_tolerance needs torchft's lighthouse, and "
                          f"torchft is not installed {where}: {INSTALL_HINT}; or remove "
                          "fault_tolerance from the distribution.")


class Lighthouse:
    """One lighthouse process; `address` is what the ranks are told (http://host:port)."""

    def __init__(self, log_file: Path, env: dict[str, str] | None = None, *,
                 bind_host: str = LOOPBACK, advertise_host: str = LOOPBACK,
                 fault_tolerance: FaultTolerance | None = None) -> None:
        self.log_file = log_file
        self.env = env
        self.bind_host = bind_host
        self.advertise_host = advertise_host
        self.fault_tolerance = fault_tolerance or FaultTolerance(replica_groups=2)
        self.proc: subprocess.Popen | None = None
        self.address = ""

    def argv(self) -> list[str]:
        # run as a script, not -m: the lighthouse parses the process's own argv after argv[0]
        return [sys.executable, str(ENTRY_SCRIPT), *lighthouse_arguments(self.fault_tolerance),
                "--bind", f"{url_host(self.bind_host)}:0"]  # port 0: the kernel picks it

    def start(self, timeout: float = START_TIMEOUT_SECONDS) -> str:
        """Start it and wait until it listens; return its address. LighthouseError with its
        log if it exits or stays silent."""
        env = dict(self.env if self.env is not None else os.environ)
        env.setdefault("RUST_LOG", "info")  # it says where it listens only at info level
        with open(self.log_file, "ab") as log:
            self.proc = subprocess.Popen(self.argv(), env=env, stdout=log,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                         start_new_session=True, umask=PRIVATE_UMASK)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            port = self._port_from_log()
            if port:
                self.address = f"http://{url_host(self.advertise_host)}:{port}"
                return self.address
            if self.proc.poll() is not None:
                raise LighthouseError(self._failure(f"exited with code {self.proc.returncode}"))
            time.sleep(0.1)
        self.stop()
        raise LighthouseError(self._failure(f"did not listen within {timeout:.0f} s"))

    def _port_from_log(self) -> int | None:
        with contextlib.suppress(OSError):
            match = LISTENING.search(self.log_file.read_text(errors="replace"))
            if match:
                return int(match.group(1))
        return None

    def _failure(self, what: str) -> str:
        text = ""
        with contextlib.suppress(OSError):
            text = self.log_file.read_text(errors="replace")[-2000:]
        return f"the torchft lighthouse {what}; its log ({self.log_file}):\n{text}"

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc is not None else None

    def stop(self) -> None:
        """SIGTERM its process group, SIGKILL after STOP_SECONDS; reap it."""
        if self.proc is None or self.proc.poll() is not None:
            return
        for sig, wait in ((signal.SIGTERM, STOP_SECONDS), (signal.SIGKILL, STOP_SECONDS)):
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(self.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout=wait)
                return
