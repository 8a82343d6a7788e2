"""Checks of the code a job ships: entry_point, source_dir and dependencies.

What is packed into sourcedir.tar.gz is checked on the user's machine, before anything is packed:
links that leave the directory, FIFOs/devices/sockets (packing would block or fail on the host),
and the total size (the tarball is built in memory and copied to every host).
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.archive import EXCLUDED_DIRS, EXCLUDED_SUFFIXES
from meshtrain.contract.errors import ConfigError
from meshtrain.estimator_values import shown

MAX_SOURCE_BYTES = 256 * 1024 * 1024
"""What source_dir (plus dependencies) may hold: code, not data. Data goes in fit() channels."""
MAX_SOURCE_FILES = 50_000


def _files_near(root: Path, limit: int = 2000) -> list[str]:
    """Relative paths of (at most `limit`) files under `root`, for a did-you-mean."""
    found: list[str] = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        found += [Path(dirpath, f).relative_to(root).as_posix() for f in filenames]
        if len(found) >= limit:
            break
    return found


def _no_such_entry_point(entry_point: str, root: Path, where: str) -> ConfigError:
    candidates = _files_near(root)
    hint = did_you_mean(entry_point, candidates) or did_you_mean(
        Path(entry_point).name, [Path(c).name for c in candidates])
    scripts = sorted(c for c in candidates if c.endswith((".py", ".sh")))[:8]
    listing = f" Scripts there: {', '.join(scripts)}." if scripts and not hint else ""
    return ConfigError(f"entry_point={shown(entry_point)} is not a file in {where} {root}.{hint}"
                       f"{listing}")


def check_entry_point(entry_point: object, source_dir: object) -> tuple[str, str]:
    """Return (source, entry point relative to it); source is a directory or the script itself."""
    if not isinstance(entry_point, str) or not entry_point or "\x00" in entry_point:
        raise ConfigError("entry_point must be the path of a training script, e.g. 'train.py'.")
    if source_dir is not None and (not isinstance(source_dir, str | os.PathLike)
                                   or "\x00" in str(source_dir) or not str(source_dir)):
        raise ConfigError(f"source_dir must be a directory path or None, got {shown(source_dir)}.")
    if isinstance(source_dir, str) and source_dir.startswith("s3://"):
        # The code is already in S3 (SageMaker jobs only, as Estimator.attach rebuilds them).
        if Path(entry_point).is_absolute() or ".." in Path(entry_point).parts:
            raise ConfigError(f"entry_point={shown(entry_point)} must be a path inside the "
                              f"source tarball {source_dir}, e.g. 'train.py'.")
        return source_dir, Path(entry_point).as_posix()
    if source_dir is None:
        script = Path(entry_point).resolve()
        if not script.is_file():
            raise _no_such_entry_point(Path(entry_point).name, script.parent, "the directory")
        return str(script), script.name
    source = Path(source_dir).resolve()
    if not source.is_dir():
        raise ConfigError(f"source_dir={shown(str(source_dir))} is not a directory.")
    if Path(entry_point).is_absolute() or ".." in Path(entry_point).parts:
        raise ConfigError(f"entry_point={shown(entry_point)} must be a path inside source_dir "
                          f"({source}), e.g. 'train.py'.")
    if not (source / entry_point).is_file():
        raise _no_such_entry_point(entry_point, source, "source_dir")
    return str(source), Path(entry_point).as_posix()


def _special_kind(mode: int) -> str | None:
    for test, kind in ((stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device")):
        if test(mode):
            return kind
    return None


def _check_entry(path: Path, root: Path, what: str) -> int:
    """Size `path` adds to the tarball; ConfigError for escaping links and special files."""
    info = path.lstat()
    if stat.S_ISLNK(info.st_mode):
        target = Path(os.path.realpath(path))
        if not target.exists():
            raise ConfigError(f"{what}: {path} is a link to {shown(os.readlink(path))}, which does "
                              "not exist. Remove the link.")
        if root.is_dir() and not target.is_relative_to(root):
            raise ConfigError(f"{what}: {path} links to {target}, outside {root}; the job would "
                              "not see it. Copy the file in, or pass it in dependencies.")
        info = target.stat()
    kind = _special_kind(info.st_mode)
    if kind:
        raise ConfigError(f"{what}: {path} is {kind}, which cannot be packed into the job's "
                          "source archive. Move it out of the directory.")
    return info.st_size if stat.S_ISREG(info.st_mode) else 0


def check_source(root: Path, *, what: str) -> int:
    """Walk what the archive would pack from `root` (a directory or one file); return its bytes."""
    root = Path(root)
    if root.is_file() or root.is_symlink() or not root.is_dir():
        return _check_entry(root, root.resolve().parent, what)
    sizes: list[tuple[int, str]] = []
    for dirpath, dirnames, filenames in os.walk(root):  # does not follow directory links
        dirnames[:] = [d for d in dirnames if d not in EXCLUDED_DIRS]
        base = Path(dirpath)
        for name in [*dirnames, *(f for f in filenames if not f.endswith(EXCLUDED_SUFFIXES))]:
            sizes.append((_check_entry(base / name, root, what), str(base / name)))
            if len(sizes) > MAX_SOURCE_FILES:
                raise ConfigError(f"{what}: {root} holds more than {MAX_SOURCE_FILES} files; "
                                  "a source directory is for code. Move data out and pass it "
                                  "as a fit() input channel.")
    total = sum(size for size, _ in sizes)
    if total > MAX_SOURCE_BYTES:
        raise ConfigError(_too_big(what, root, total, sizes))
    return total


def _too_big(what: str, root: Path, total: int, sizes: list[tuple[int, str]]) -> str:
    biggest = ", ".join(f"{name} ({size / 2**20:.0f} MiB)" for size, name in
                        sorted(sizes, reverse=True)[:3])
    return (f"{what}: {root} holds {total / 2**20:.0f} MiB, more than the "
            f"{MAX_SOURCE_BYTES // 2**20} MiB a job's source archive may hold (it is packed in "
            f"memory and copied to every host). Biggest: {biggest}. Move data out of the "
            "directory and pass it as a fit() input channel.")


def check_sources(source: str, dependencies: object) -> list[str]:
    """source_dir and dependencies: contents checked, total size bounded; returns dependencies."""
    if dependencies is None:
        dependencies = []
    if isinstance(dependencies, str) or not isinstance(dependencies, list | tuple):
        raise ConfigError(f"dependencies must be a list of paths, got {shown(dependencies)}.")
    resolved = []
    for dependency in dependencies:
        if not isinstance(dependency, str | os.PathLike) or "\x00" in str(dependency) or not (
                str(dependency)):
            raise ConfigError(f"dependencies: {shown(dependency)} is not a path.")
        path = Path(dependency).resolve()
        if not path.exists():
            raise ConfigError(f"dependencies: {dependency} does not exist.")
        resolved.append(path)
    if len({p.name for p in resolved}) != len(resolved):
        raise ConfigError("dependencies: two entries have the same name; each is unpacked under "
                          "its own name in the code directory. Rename one.")
    total = 0 if source.startswith("s3://") else check_source(Path(source), what="source_dir")
    for path in resolved:
        total += check_source(path, what=f"dependencies ({path.name})")
    if total > MAX_SOURCE_BYTES:
        raise ConfigError(f"source_dir and dependencies hold {total / 2**20:.0f} MiB together, "
                          f"more than {MAX_SOURCE_BYTES // 2**20} MiB. Move data out and pass "
                          "it as a fit() input channel.")
    return [str(p) for p in resolved]
