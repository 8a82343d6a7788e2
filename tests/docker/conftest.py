"""The `docker` tier: a private dockerd for the whole run, and the test image built once.

Nothing is installed here (.ci/run installs docker.io). Where there is no engine to start (no
dockerd, not root, no mmdebstrap), every test of the tier is skipped with the reason printed
(`-ra`) on a developer's machine and fails under CI=true (tests/ci_guards.py). An engine that is
there but does not start is an error with the daemon's log, never a skip. The daemon is stopped
by its pid at the end of the session, after its networks are removed.
"""

from __future__ import annotations

import os
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).parent))

from ci_guards import missing_component
from docker_daemon import Daemon, start_daemon, stop_daemon, why_not_startable
from docker_image import build_test_image, python_volumes


@dataclass
class Engine:
    """What the tier's tests get: the daemon, the test image and the mounts it needs."""

    daemon: Daemon
    image: str
    volumes: list[tuple[str, str, str]]

    def options(self) -> dict:
        """Estimator keywords that run a job on this engine's test image."""
        return {"image_uri": self.image, "volumes": self.volumes}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.docker)


@pytest.fixture(scope="session")
def docker_engine(tmp_path_factory: pytest.TempPathFactory):
    reason = why_not_startable()
    if reason:
        missing_component(f"docker tier: {reason}")
    # A short path: the daemon's unix socket must stay under 108 characters.
    root = Path(tmp_path_factory.mktemp("dockerd", numbered=True))
    try:
        daemon = start_daemon(root)
    except RuntimeError as error:  # installed but broken: an error with its log, never a skip
        pytest.fail(f"docker tier: the engine could not start: {error}", pytrace=False)
    previous = os.environ.get("DOCKER_HOST")
    os.environ["DOCKER_HOST"] = daemon.host
    try:
        image = build_test_image(daemon, root / "image-context")
        yield Engine(daemon, image, python_volumes())
    finally:
        stop_daemon(daemon)
        if previous is None:
            os.environ.pop("DOCKER_HOST", None)
        else:
            os.environ["DOCKER_HOST"] = previous


@pytest.fixture
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("MESHTRAIN_HOME", str(tmp_path / "home"))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    return tmp_path / "home"


@pytest.fixture(scope="session")
def meshtrain_image(docker_engine: Engine) -> str:
    """meshtrain's own CPU image (mmdebstrap root file system + torch, then meshtrain's layer),
    built once per run without any registry."""
    import shutil
    import time

    from meshtrain.backends.docker.image import build_image

    if shutil.which("mmdebstrap") is None:
        missing_component("docker tier: no mmdebstrap to build meshtrain's image "
                          "(.ci/run installs it)")
    start = time.monotonic()
    tag = build_image()
    print(f"\nmeshtrain's CPU image {tag} built in {time.monotonic() - start:.0f} s")
    return tag
