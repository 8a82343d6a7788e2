"""A job's files are its owner's alone: the one home of meshtrain's file-permission policy.

Everything meshtrain writes for a job (MESHTRAIN_HOME and its jobs, a Slurm job's directory on
the shared filesystem, what containers write through their bind mounts, per-job environments)
is owner-only: directories 0700, files 0600, whatever the caller's umask. Two means, one policy:

- every process meshtrain starts for a job (supervisor, Slurm batch and node steps, hosts, the
  lighthouse) runs with umask 077 (``PRIVATE_UMASK``: ``subprocess.Popen(umask=...)``, or
  ``restrict_umask()`` at its entry), so what it and the user's script create is owner-only;
- the client, whose umask is its caller's, creates the job directory with
  ``make_private_dir`` and writes the job's files inside ``private_umask()``.

Torch-free and import-light: the client and the runtime (which imports only meshtrain.contract
from the client) both use it.
"""

from __future__ import annotations

import contextlib
import os
import pwd
import stat
from collections.abc import Iterator
from pathlib import Path

from meshtrain.contract.errors import ConfigError

PRIVATE_DIR_MODE = 0o700
PRIVATE_FILE_MODE = 0o600
PRIVATE_UMASK = 0o077
"""Clears every group and other permission bit of what a process creates."""

MESHTRAIN_HOME = "MESHTRAIN_HOME"


def meshtrain_home() -> Path:
    """``$MESHTRAIN_HOME``, by default ~/.meshtrain (jobs, per-job environments)."""
    return Path(os.environ.get(MESHTRAIN_HOME) or Path.home() / ".meshtrain")


def restrict_umask() -> None:
    """Make this process's files owner-only from now on (a stricter umask is kept)."""
    current = os.umask(PRIVATE_UMASK)
    os.umask(current | PRIVATE_UMASK)


@contextlib.contextmanager
def private_umask() -> Iterator[None]:
    """Within the block, files and directories this process creates are owner-only.

    The umask is per process, so another thread creating a file meanwhile gets the stricter
    mode too: it can only ever take permissions away, never grant them.
    """
    previous = os.umask(PRIVATE_UMASK)
    try:
        yield
    finally:
        os.umask(previous)


def make_private_dir(path: Path, parents: bool = False) -> bool:
    """Create `path` with mode 0700 (missing parents too, with `parents`); an existing
    directory is left as it is. Whether it was created (FileExistsError never raised)."""
    if parents and not path.parent.exists():
        make_private_dir(path.parent, parents=True)
    try:
        path.mkdir(mode=PRIVATE_DIR_MODE)
    except FileExistsError:
        if not path.is_dir():
            raise
        return False
    os.chmod(path, PRIVATE_DIR_MODE)  # mkdir's mode passes through the umask: say it exactly
    return True


def write_private_bytes(path: Path, data: bytes) -> None:
    """Write `data` to `path` with mode 0600 (an existing file's looser mode is tightened first,
    so its new content is never readable by others)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, PRIVATE_FILE_MODE)
    with os.fdopen(fd, "wb") as handle:
        os.fchmod(handle.fileno(), PRIVATE_FILE_MODE)
        handle.write(data)


def write_private_text(path: Path, text: str) -> None:
    """`write_private_bytes` of UTF-8 text."""
    write_private_bytes(path, text.encode())


def open_to_others(path: Path) -> bool:
    """Whether group or others hold any permission on `path`."""
    return bool(stat.S_IMODE(path.stat().st_mode) & PRIVATE_UMASK)


def home_warning(home: Path) -> str | None:
    """The one line to print when an existing MESHTRAIN_HOME is open to other users."""
    try:
        if not open_to_others(home):
            return None
        mode = stat.S_IMODE(home.stat().st_mode)
    except OSError:
        return None
    return (f"MESHTRAIN_HOME {home} is open to other users (mode {mode:04o}); new jobs are "
            f"private, but jobs made before may not be: run `chmod 700 {home}`.")


def owner_uid(path: Path) -> int:
    """The uid that owns `path` (a job directory's owner owns the job)."""
    return path.stat().st_uid


def user_text(uid: int) -> str:
    """'user NAME (uid N)', or 'uid N' for a uid without a name here."""
    try:
        return f"user {pwd.getpwuid(uid).pw_name} (uid {uid})"
    except KeyError:
        return f"uid {uid}"


def check_owned(path: Path, what: str, action: str) -> None:
    """ConfigError unless this process's user owns `path` (a job's directory): only a job's
    owner may stop or delete it, whoever else can reach its files."""
    owner, caller = owner_uid(path), os.getuid()
    if owner != caller:
        raise ConfigError(f"{what} belongs to {user_text(owner)}, not to {user_text(caller)}: "
                          f"only its owner can {action} it. Run the command as that user.")
