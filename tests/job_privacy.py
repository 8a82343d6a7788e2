"""Checks of issue 43 that the tiers' job tests share: a job's files tried as another user
(`runuser -u nobody`, as root), their modes, and the addresses its processes listen on (from
/proc: each process's socket inodes matched against /proc/net/tcp and tcp6)."""

from __future__ import annotations

import atexit
import contextlib
import functools
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
    require_other_user()
    return as_other_user(other_user_python(), "-m", "meshtrain.cli", *argv,
                         env={**env, "PYTHONPATH": _import_path_for_other_user()})


# Every module of the client imported (whatever a command reaches: `rm` finds a job by name
# on every target, so boto3 too), then where each imported module came from.
_CLI_MODULES = """
import contextlib, importlib, json, pkgutil, sys
import meshtrain
for module in pkgutil.walk_packages(meshtrain.__path__, "meshtrain."):
    with contextlib.suppress(Exception):
        importlib.import_module(module.name)
print(json.dumps(sorted({m.__spec__.origin for m in list(sys.modules.values())
                         if getattr(m, "__spec__", None) and m.__spec__.origin})))
"""


@functools.cache
def _import_path_for_other_user() -> str:
    """PYTHONPATH for OTHER_USER: the checkout's sdk/ and this environment's packages, or, when
    they lie under a directory OTHER_USER cannot enter (a 0700 temporary directory or home),
    hard links of the packages `meshtrain stop` / `rm` import, in a directory it can."""
    import meshtrain

    sdk = Path(meshtrain.__file__).parents[1]
    packages = [Path(path) for path in site.getsitepackages()]
    path = [str(p) for p in [sdk, *packages]]
    if len(_opened_by_other_user(path)) == len(path):
        return os.pathsep.join(path)
    staged = Path(tempfile.mkdtemp(prefix="meshtrain-other-user-"))
    atexit.register(shutil.rmtree, staged, ignore_errors=True)
    staged.chmod(0o755)
    done = subprocess.run([sys.executable, "-c", _CLI_MODULES], capture_output=True,
                          text=True, timeout=120, check=True)
    for origin in map(Path, json.loads(done.stdout.splitlines()[-1])):
        for root in [sdk, *packages]:
            if origin.is_relative_to(root):
                top = root / origin.relative_to(root).parts[0]
                _link_tree(top, staged / top.name)
    return str(staged)


def _link_tree(source: Path, target: Path) -> None:
    """`source` (a package directory or a module file) at `target`, readable by everyone: hard
    links of the files others may read (no copy of a large package), copies of the rest."""
    if target.exists():
        return
    def link(src: str, dst: str) -> None:
        if os.stat(src).st_mode & stat.S_IROTH:
            with contextlib.suppress(OSError):
                os.link(src, dst)
                return
        shutil.copy2(src, dst)
        os.chmod(dst, 0o644)
    if source.is_dir():
        shutil.copytree(source, target, copy_function=link,
                        ignore=shutil.ignore_patterns("__pycache__"))
        for directory in [target, *(p for p in target.rglob("*") if p.is_dir())]:
            directory.chmod(0o755)
    else:
        link(str(source), str(target))


def _opened_by_other_user(paths: list[str]) -> list[str]:
    """Those of `paths` OTHER_USER can open (a file) or list (a directory)."""
    done = as_other_user(other_user_python(), "-c", _TRY_EACH, stdin=json.dumps(paths))
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout)


def every_path(root: Path) -> list[Path]:
    """`root` and everything under it (symbolic links themselves, never followed)."""
    found = [root]
    for dirpath, dirnames, filenames in os.walk(root):
        found += [Path(dirpath) / name for name in dirnames + filenames]
    return found


def readable_by_other_user(root: Path) -> list[str]:
    """The paths under `root` that OTHER_USER can open (a file) or list (a directory)."""
    require_other_user()
    return _opened_by_other_user([str(path) for path in every_path(root)])


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
    name: str = ""
    """The process's name then (/proc/PID/comm: a rank's is mt-rank-<RANK>)."""

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


def _name(pid: int) -> str:
    try:
        return Path(f"/proc/{pid}/comm").read_text().strip()
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
                found.append(Listener(pid, *_address(fields[1]), _command(pid), _name(pid)))
    return found
