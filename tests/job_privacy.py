"""Checks of issue 43 that the tiers' job tests share: a job's files tried as another user
(`runuser -u nobody`, as root), their modes, and the addresses its processes listen on (from
/proc: each process's socket inodes matched against /proc/net/tcp and tcp6)."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import site
import stat
import subprocess
import sys
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

from ci_guards import missing_component

OTHER_USER = "nobody"
LISTEN = "0A"  # TCP_LISTEN in /proc/net/tcp's st column
_TRY_EACH = """
import json, os, sys
opened = []
for path in json.load(sys.stdin):
    try:
        if os.path.isdir(path) and not os.path.islink(path):
            os.listdir(path)
        else:
            with open(path, "rb") as handle:
                handle.read(1)
        opened.append(path)
    except OSError:
        pass
print(json.dumps(opened))
"""


def require_other_user() -> None:
    """Trying files as another user needs root and runuser (a skip outside CI, else a fail)."""
    if os.geteuid() != 0 or shutil.which("runuser") is None:
        missing_component("reading a job's files as another user needs root and runuser")


def as_other_user(*argv: str, env: dict[str, str] | None = None,
                  stdin: str | None = None) -> subprocess.CompletedProcess:
    """Run `argv` as OTHER_USER (root only: runuser)."""
    runuser = shutil.which("runuser") or "runuser"
    return subprocess.run([runuser, "-u", OTHER_USER, "--", *argv], input=stdin, env=env,
                          capture_output=True, text=True, timeout=120)


def other_user_python() -> str:
    """An interpreter of this Python's version that OTHER_USER can run (this one may live in
    root's own 0700 home, as pyenv's does)."""
    version = f"{sys.version_info.major}.{sys.version_info.minor}"
    candidates = [sys.executable, os.path.realpath(sys.executable), f"/usr/bin/python{version}",
                  shutil.which(f"python{version}") or ""]
    for candidate in filter(None, candidates):
        done = as_other_user(candidate, "-c", "import sys; print(sys.version_info[:2])")
        if done.returncode == 0 and done.stdout.strip() == str(sys.version_info[:2]):
            return candidate
    missing_component(f"no Python {version} that user {OTHER_USER} can run")
    raise AssertionError("unreachable")


def meshtrain_as_other_user(*argv: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    """`meshtrain ARGV` as OTHER_USER, importing this checkout and this environment's
    packages (an editable install's path hook is read only by its own interpreter)."""
    import meshtrain

    require_other_user()

    paths = [str(Path(meshtrain.__file__).parents[1]), *site.getsitepackages()]
    return as_other_user(other_user_python(), "-m", "meshtrain.cli", *argv,
                         env={**env, "PYTHONPATH": os.pathsep.join(paths)})


def every_path(root: Path) -> list[Path]:
    """`root` and everything under it (symbolic links themselves, never followed)."""
    found = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        found += [Path(dirpath) / name for name in dirnames + filenames]
    return found


def readable_by_other_user(root: Path) -> list[str]:
    """The paths under `root` that OTHER_USER can open (a file) or list (a directory)."""
    require_other_user()
    paths = [str(path) for path in every_path(root)]
    done = as_other_user(other_user_python(), "-c", _TRY_EACH, stdin=json.dumps(paths))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def open_modes(root: Path) -> list[str]:
    """Paths under `root` (not links) whose mode gives group or others any permission."""
    return [f"{path} {stat.S_IMODE(path.lstat().st_mode):04o}" for path in every_path(root)
            if not path.is_symlink() and stat.S_IMODE(path.lstat().st_mode) & 0o077]


@contextmanager
def open_directory() -> Iterator[Path]:
    """A 0755 directory under /tmp, as a user's home is (pytest's own tmp_path is 0700, which
    would hide everything below it from other users whatever meshtrain does)."""
    base = Path(tempfile.mkdtemp(prefix="meshtrain-open-"))
    base.chmod(0o755)
    try:
        yield base
    finally:
        shutil.rmtree(base, ignore_errors=True)


@contextmanager
def umask(value: int) -> Iterator[None]:
    previous = os.umask(value)
    try:
        yield
    finally:
        os.umask(previous)


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket of a process."""

    pid: int
    address: str
    port: int
    command: str = ""
    """The process's command line when it was seen (who it was, once it has ended)."""

    @property
    def loopback(self) -> bool:
        address = ipaddress.ip_address(self.address)
        return (getattr(address, "ipv4_mapped", None) or address).is_loopback


def _address(hex_address: str) -> tuple[str, int]:
    """/proc/net/tcp's `HEX:PORT` (little-endian words) as (address, port)."""
    host, port = hex_address.split(":")
    raw = bytes.fromhex(host)
    words = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    return str(ipaddress.ip_address(words)), int(port, 16)


def _socket_inodes(pid: int) -> set[str]:
    inodes = set()
    try:
        for fd in os.listdir(f"/proc/{pid}/fd"):
            try:
                target = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if target.startswith("socket:["):
                inodes.add(target[8:-1])
    except OSError:  # the process ended meanwhile
        pass
    return inodes


def _command(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode().strip()
    except OSError:
        return ""


def listeners(pids: Iterable[int]) -> list[Listener]:
    """Every listening TCP socket (IPv4 and IPv6) held by one of `pids`."""
    owner = {inode: pid for pid in pids for inode in _socket_inodes(pid)}
    found = []
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        for line in Path(table).read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] == LISTEN and fields[9] in owner:
                pid = owner[fields[9]]
                found.append(Listener(pid, *_address(fields[1]), _command(pid)))
    return found
