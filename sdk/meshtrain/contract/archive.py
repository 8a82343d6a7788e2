"""sourcedir.tar.gz: written deterministically by the client, extracted safely on the host."""

from __future__ import annotations

import gzip
import io
import os
import posixpath
import stat
import tarfile
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.private_files import PRIVATE_UMASK

EXCLUDED_DIRS = frozenset({".git", "__pycache__", ".ipynb_checkpoints", ".pytest_cache"})
EXCLUDED_SUFFIXES = (".pyc", ".pyo")


class UnsafeArchiveError(ConfigError):
    """A tarball member would land outside the extraction directory."""


def _walk(root: Path) -> Iterator[Path]:
    """Files and directories under `root`, sorted, without junk (.git, caches, *.pyc)."""
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = sorted(d for d in dirnames if d not in EXCLUDED_DIRS)
        base = Path(dirpath)
        for name in dirnames:
            yield base / name
        for name in sorted(filenames):
            if not name.endswith(EXCLUDED_SUFFIXES):
                yield base / name


def _normalised_info(tar: tarfile.TarFile, path: Path, arcname: str) -> tarfile.TarInfo:
    info = tar.gettarinfo(str(path), arcname=arcname)
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    info.mode = 0o755 if info.isdir() or os.access(path, os.X_OK) else 0o644
    return info


def _add_bytes(tar: tarfile.TarFile, arcname: str, data: bytes) -> None:
    info = tarfile.TarInfo(arcname)
    info.size, info.mode = len(data), 0o644
    tar.addfile(info, io.BytesIO(data))


def write_sourcedir_tarball(
    source_dir: Path, destination: Path, dependencies: Iterable[Path] = (),
    replace: Mapping[str, bytes] | None = None,
) -> list[str]:
    """Pack `source_dir` (and each dependency under its own name) into a gzip tarball.

    `replace` maps top-level file names to the bytes stored under that name instead of the
    source's file (or added when the source has none). The bytes depend only on the files'
    names, contents and executable bits. Returns the member names written.
    """
    replace = dict(replace or {})
    roots = [(Path(source_dir), "")] + [(Path(d), Path(d).name) for d in dependencies]
    members: list[str] = []
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for root, prefix in roots:
            if root.is_file():
                entries = [root]
            else:  # a dependency directory is added under its own name, itself included
                entries = [root, *_walk(root)] if prefix else list(_walk(root))
            for path in entries:
                rel = path.name if root.is_file() else path.relative_to(root).as_posix()
                arcname = posixpath.normpath(posixpath.join(prefix, rel)) if prefix else rel
                info = _normalised_info(tar, path, arcname)
                if arcname in replace and info.isfile():
                    _add_bytes(tar, arcname, replace.pop(arcname))
                elif info.isfile():
                    with open(path, "rb") as handle:
                        tar.addfile(info, handle)
                else:
                    tar.addfile(info)
                members.append(arcname)
        for arcname, data in sorted(replace.items()):
            _add_bytes(tar, arcname, data)
            members.append(arcname)
    destination.parent.mkdir(parents=True, exist_ok=True)
    with open(destination, "wb") as raw, gzip.GzipFile(
        filename="", mode="wb", fileobj=raw, mtime=0
    ) as gz:
        gz.write(buffer.getvalue())
    return members


def _inside(root: str, target: str) -> bool:
    return os.path.commonpath([root, target]) == root


def check_members(members: Iterable[tarfile.TarInfo], destination: Path) -> None:
    """Refuse absolute names, `..` components, device files and links that leave `destination`."""
    root = os.path.realpath(destination)
    for member in members:
        name = member.name
        if name.startswith(("/", "\\")) or (len(name) > 1 and name[1] == ":"):
            raise UnsafeArchiveError(f"refusing archive member with an absolute path: {name!r}")
        if ".." in Path(name).parts:
            raise UnsafeArchiveError(f"refusing archive member with '..' in its path: {name!r}")
        target = os.path.realpath(os.path.join(root, name))
        if not _inside(root, target):
            raise UnsafeArchiveError(f"refusing archive member outside the directory: {name!r}")
        if member.issym() or member.islnk():
            base = root if member.islnk() else os.path.dirname(target)
            link = os.path.realpath(os.path.join(base, member.linkname))
            if os.path.isabs(member.linkname) or not _inside(root, link):
                raise UnsafeArchiveError(
                    f"refusing link {name!r} -> {member.linkname!r}: it points outside "
                    "the directory"
                )
        elif not (member.isfile() or member.isdir()):
            raise UnsafeArchiveError(f"refusing special archive member {name!r}")


def safe_extract(tarball: Path, destination: Path) -> None:
    """Extract a (gzip) tarball into `destination` after checking every member; what it
    writes is its owner's alone (the members' group and other bits are cleared, as
    contract/private_files.py says of every file of a job)."""
    destination.mkdir(parents=True, exist_ok=True)
    with tarfile.open(tarball, mode="r:*") as tar:
        members = tar.getmembers()
        check_members(members, destination)
        if hasattr(tarfile, "data_filter"):
            tar.extractall(destination, members=members, filter="data")
        else:  # Python without extraction filters: the checks above are the guard
            tar.extractall(destination, members=members)
    for dirpath, dirnames, filenames in os.walk(destination):  # members keep their own modes
        for path in (Path(dirpath) / name for name in [*dirnames, *filenames]):
            if not path.is_symlink():
                path.chmod(stat.S_IMODE(path.stat().st_mode) & ~PRIVATE_UMASK)
