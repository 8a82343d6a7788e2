"""sourcedir.tar.gz: deterministic packing and refusal of members that escape on extraction."""

from __future__ import annotations

import io
import tarfile
import time

import pytest

from meshtrain.contract.archive import UnsafeArchiveError, safe_extract, write_sourcedir_tarball


@pytest.fixture
def source(tmp_path):
    root = tmp_path / "src"
    (root / "pkg" / "__pycache__").mkdir(parents=True)
    (root / ".git").mkdir()
    (root / ".ipynb_checkpoints").mkdir()
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "util.pyc").write_bytes(b"junk")
    (root / "pkg" / "__pycache__" / "x.cpython-311.pyc").write_bytes(b"junk")
    (root / ".git" / "HEAD").write_text("ref")
    (root / ".ipynb_checkpoints" / "nb.ipynb").write_text("{}")
    return root


def test_tarball_holds_exactly_the_sources_and_dependencies(source, tmp_path):
    dep = tmp_path / "mylib"
    dep.mkdir()
    (dep / "helpers.py").write_text("X = 1\n")
    members = write_sourcedir_tarball(source, tmp_path / "a.tar.gz", [dep])
    with tarfile.open(tmp_path / "a.tar.gz") as tar:
        names = sorted(tar.getnames())
    assert names == sorted(members) == ["mylib", "mylib/helpers.py", "pkg", "pkg/__init__.py",
                                        "train.py"]


def test_tarball_bytes_are_deterministic(source, tmp_path):
    write_sourcedir_tarball(source, tmp_path / "a.tar.gz")
    time.sleep(1.1)
    (source / "train.py").touch()  # a new mtime must not change the bytes
    write_sourcedir_tarball(source, tmp_path / "b.tar.gz")
    assert (tmp_path / "a.tar.gz").read_bytes() == (tmp_path / "b.tar.gz").read_bytes()


def test_single_script_is_packed_alone(source, tmp_path):
    write_sourcedir_tarball(source / "train.py", tmp_path / "s.tar.gz")
    with tarfile.open(tmp_path / "s.tar.gz") as tar:
        assert tar.getnames() == ["train.py"]


def test_safe_extract_round_trip(source, tmp_path):
    write_sourcedir_tarball(source, tmp_path / "a.tar.gz")
    safe_extract(tmp_path / "a.tar.gz", tmp_path / "out")
    assert (tmp_path / "out" / "train.py").read_text() == "print('hi')\n"


def _tarball(path, *members):
    with tarfile.open(path, "w:gz") as tar:
        for info, data in members:
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return path


def _file(name, data=b"x"):
    info = tarfile.TarInfo(name)
    info.size = len(data)
    return info, data


def _link(name, target, kind=tarfile.SYMTYPE):
    info = tarfile.TarInfo(name)
    info.type = kind
    info.linkname = target
    return info, None


@pytest.mark.parametrize("member", [
    _file("../evil.py"),
    _file("a/../../evil.py"),
    _file("/etc/evil.py"),
    _link("escape", "../../outside"),
    _link("abs", "/etc/passwd"),
    _link("hard", "../outside", tarfile.LNKTYPE),
], ids=["dotdot", "nested-dotdot", "absolute", "symlink-escape", "symlink-absolute", "hardlink"])
def test_unsafe_members_are_refused_and_nothing_is_written(tmp_path, member):
    tarball = _tarball(tmp_path / "bad.tar.gz", _file("ok.py"), member)
    target = tmp_path / "dest" / "code"
    with pytest.raises(UnsafeArchiveError):
        safe_extract(tarball, target)
    assert not (target / "ok.py").exists()
    assert not (tmp_path / "evil.py").exists()


def test_link_staying_inside_is_allowed(tmp_path):
    tarball = _tarball(tmp_path / "ok.tar.gz", _file("data/a.txt"), _link("data/b.txt", "a.txt"))
    safe_extract(tarball, tmp_path / "out")
    assert (tmp_path / "out" / "data" / "b.txt").read_text() == "x"
