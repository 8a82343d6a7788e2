"""The tier's test image: an empty image with this machine's Python bind-mounted read-only.

It builds in well under a second (nothing is copied but a few /etc files), and any container
of it runs this interpreter with this virtual environment's torch. Only for tests on this
machine: real jobs use meshtrain's image (`meshtrain image build`) or the user's own.
"""

from __future__ import annotations

import os
import shutil
import sys
from pathlib import Path

from docker_daemon import Daemon

TEST_IMAGE = "meshtrain-test-hostpython:latest"
ETC_FILES = ("nsswitch.conf", "ld.so.cache", "ld.so.conf", "host.conf")
TOP_LEVEL_LINKS = ("bin", "lib", "lib64", "sbin", "lib32", "libx32")


def python_volumes() -> list[tuple[str, str, str]]:
    """Read-only mounts that give a container this interpreter and virtual environment."""
    paths = {"/usr", os.path.realpath(sys.base_prefix), os.path.realpath(sys.prefix)}
    return [(p, p, "ro") for p in sorted(paths)]


def _root_lines(path: Path) -> str:
    return "".join(line + "\n" for line in path.read_text().splitlines()
                   if line.startswith("root:"))


def build_test_image(daemon: Daemon, context: Path) -> str:
    """`FROM scratch` + /etc files (nsswitch.conf: glibc must read /etc/hosts before DNS;
    alternatives) +
    the merged-/usr links + PATH to this venv. Returns the tag."""
    etc = context / "etc"
    etc.mkdir(parents=True, exist_ok=True)
    for name in ETC_FILES:
        if Path("/etc", name).is_file():
            shutil.copy(Path("/etc", name), etc / name)
    # Debian's alternatives: /usr/bin/which and others are links through /etc/alternatives
    alternatives = Path("/etc/alternatives")
    if alternatives.is_dir():
        shutil.copytree(alternatives, etc / "alternatives", symlinks=True, dirs_exist_ok=True)
    (etc / "passwd").write_text(_root_lines(Path("/etc/passwd")))
    (etc / "group").write_text(_root_lines(Path("/etc/group")))
    for name in ("tmp", "root"):
        (context / name).mkdir(exist_ok=True)
        (context / name / ".keep").write_text("")
    links = [name for name in TOP_LEVEL_LINKS if Path("/", name).is_symlink()]
    for name in links:
        target = context / name
        if not target.is_symlink():
            target.symlink_to(os.readlink(Path("/", name)))
    venv_bin = Path(sys.prefix) / "bin"
    lines = ["FROM scratch", "COPY . /",
             f"ENV PATH={venv_bin}:/usr/local/bin:/usr/bin:/bin HOME=/root LANG=C.UTF-8"]
    (context / "Dockerfile").write_text("\n".join(lines) + "\n")
    daemon.docker("build", "--quiet", "-t", TEST_IMAGE, str(context))
    return TEST_IMAGE
