"""requirements.txt: installed into a per-job environment layered on this interpreter.

A local job runs in the user's own Python, so `pip install -r requirements.txt` there would change
the user's environment behind their back. Instead the requirements go into a virtual environment
under ``$MESHTRAIN_HOME/envs/<hash>`` (default ~/.meshtrain/envs) that:

- sees everything this interpreter has (``--system-site-packages`` plus a ``.pth`` file naming this
  interpreter's site directories, so a venv made from a venv sees its parent too): pip installs
  only what is missing, never torch again;
- is keyed by the hash of requirements.txt and the interpreter, built once under a file lock
  (hosts of one job, and jobs started together, wait for one build) and reused by later jobs;
- is put in front of the job's imports through PYTHONPATH (and its bin/ on PATH): the job keeps
  this interpreter, with the environment's packages taking precedence.

Every step is a line in the job's log, followed by pip's own output.
"""

from __future__ import annotations

import fcntl
import hashlib
import os
import shutil
import site
import subprocess
import sys
from collections import deque
from pathlib import Path

from meshtrain.contract.private_files import make_private_dir, meshtrain_home
from meshtrain_runtime.host.contract import PYTHON

READY_FILE = "meshtrain-ready"
PARENT_PTH = "_meshtrain_parent_site.pth"
PIP_TAIL_LINES = 40


class ProvisionError(RuntimeError):
    """The user's code could not be made ready (a user error: exit code 1)."""


def requirements_key(requirements: Path) -> str:
    """What makes two environments interchangeable: the file's text and the interpreter."""
    digest = hashlib.sha256(requirements.read_bytes())
    digest.update(f"\0{os.path.realpath(PYTHON)}\0{sys.version}".encode())
    return digest.hexdigest()[:20]


def site_packages(env_dir: Path) -> Path:
    version = f"python{sys.version_info.major}.{sys.version_info.minor}"
    return env_dir / "lib" / version / "site-packages"


def _say(message: str) -> None:
    print(f"meshtrain: {message}", flush=True)


def _parent_site_dirs() -> list[str]:
    dirs = list(site.getsitepackages())
    if site.ENABLE_USER_SITE:
        dirs.append(site.getusersitepackages())
    return [d for d in dirs if os.path.isdir(d)]


def _run_logged(command: list[str], cwd: Path) -> tuple[int, str]:
    """Run `command`, copying its output into the job's log; return (code, last lines)."""
    tail: deque[str] = deque(maxlen=PIP_TAIL_LINES)
    proc = subprocess.Popen(command, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            stdin=subprocess.DEVNULL, text=True, errors="replace")
    for line in proc.stdout:  # type: ignore[union-attr]
        sys.stdout.write(line)
        tail.append(line)
    sys.stdout.flush()
    return proc.wait(), "".join(tail)


def _build(env_dir: Path, requirements: Path) -> None:
    if env_dir.exists():  # a build that died half-way: start again
        shutil.rmtree(env_dir)
    code, output = _run_logged([PYTHON, "-m", "venv", "--without-pip", "--system-site-packages",
                                str(env_dir)], requirements.parent)
    if code:
        raise ProvisionError(f"InstallRequirementsError: could not create {env_dir}:\n{output}")
    target = site_packages(env_dir)
    target.mkdir(parents=True, exist_ok=True)
    (target / PARENT_PTH).write_text("".join(f"{d}\n" for d in _parent_site_dirs()))
    # This interpreter's pip, told to install into the environment (pip >= 22.3).
    code, output = _run_logged([PYTHON, "-m", "pip", "--python", str(env_dir / "bin" / "python"),
                                "install", "--disable-pip-version-check", "--no-input", "-r",
                                str(requirements)], requirements.parent)
    if code:
        raise ProvisionError("InstallRequirementsError: pip install -r requirements.txt "
                             f"failed (exit code {code}):\n{output[-2000:]}")
    (env_dir / READY_FILE).write_text(requirements.read_text(errors="replace"))


def requirements_environment(requirements: Path, home: Path | None = None) -> Path:
    """The environment holding `requirements`: reused when ready, else built (under a lock)."""
    envs = (home or meshtrain_home()) / "envs"
    make_private_dir(envs, parents=True)  # the job environments are their owner's alone
    env_dir = envs / requirements_key(requirements)
    with open(envs / f"{env_dir.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file closes
        if (env_dir / READY_FILE).exists():
            _say(f"requirements.txt: reusing the job environment {env_dir} (same "
                 "requirements, nothing to install)")
            return env_dir
        _say(f"requirements.txt: installing into the job environment {env_dir} (layered on "
             f"{PYTHON}; that interpreter is not changed)")
        try:
            _build(env_dir, requirements)
        except BaseException:
            shutil.rmtree(env_dir, ignore_errors=True)  # never leave a half-built environment
            raise
    _say(f"requirements.txt: job environment {env_dir} ready")
    return env_dir


def activate(env_dir: Path) -> None:
    """Put the environment in front of the job's imports and commands.

    The bootstrap builds the ranks' environment from os.environ after provisioning, so this is
    how the job (and only the job: this process is the host's bootstrap) sees it.
    """
    paths = [str(site_packages(env_dir)), *filter(None, os.environ.get("PYTHONPATH", "")
                                                  .split(os.pathsep))]
    os.environ["PYTHONPATH"] = os.pathsep.join(paths)
    os.environ["PATH"] = os.pathsep.join([str(env_dir / "bin"), os.environ.get("PATH", "")])
