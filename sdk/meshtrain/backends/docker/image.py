"""meshtrain's own CPU image, built on this machine without any registry (`meshtrain image build`).

Two steps, cached by tag (``meshtrain:<version>-cpu``):

1. unless ``--base`` names an image: a Debian root file system from mmdebstrap (the host's own
   release and apt sources; ``--variant=essential`` plus python3, python-is-python3, libstdc++6)
   into which a customize hook pip-installs torch, numpy, pydantic and pip for the chroot's Python
   (``pip install --target``, this client's pip and package index), piped into ``docker import``;
2. ``containers/Dockerfile.cpu`` on top: this client's own meshtrain + meshtrain_runtime
   packages and the ``train`` entry (a one-second ``docker build``).
"""

from __future__ import annotations

import importlib.metadata
import importlib.util
import shlex
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from meshtrain.backends.docker.engine import docker, docker_binary, image_exists
from meshtrain.contract.errors import ConfigError
from meshtrain.version import CLIENT_PACKAGE, __version__

CONTAINERS = Path(__file__).resolve().parents[4] / "containers"
ESSENTIALS = "python3,python-is-python3,libstdc++6,ca-certificates"
BUILD_TIMEOUT = 1800
TRAIN_SCRIPT = ("#!/bin/sh\n# SageMaker runs `docker run <image> train`: hand the host over to "
                "meshtrain's bootstrap.\nexec python3 -m meshtrain_runtime.host.bootstrap \"$@\"\n")


def default_tag() -> str:
    return f"meshtrain:{__version__}-cpu"


def base_tag() -> str:
    return f"meshtrain-base:{__version__}-cpu"


def ensure_default_image() -> str:
    """meshtrain's CPU image for this client's version, built now if the engine lacks it."""
    tag = default_tag()
    if image_exists(tag):
        return tag
    print(f"meshtrain: building {tag} for local Docker jobs (first use: a Debian root file "
          "system with torch, a few minutes; `meshtrain image build` does it ahead) ...",
          file=sys.stderr, flush=True)
    return build_image()


def build_image(base: str | None = None, tag: str | None = None, rebuild: bool = False) -> str:
    """Build meshtrain's CPU image (on `base`, else on a fresh mmdebstrap root file system)."""
    tag = tag or default_tag()
    docker_binary()
    if not rebuild and image_exists(tag):
        return tag
    if base is None:
        base = base_tag()
        if rebuild or not image_exists(base):
            build_base(base)
    elif not image_exists(base):
        raise ConfigError(f"--base {base}: no such image on this engine. Load or build it "
                          "first (docker images lists what is there).")
    with tempfile.TemporaryDirectory(prefix="meshtrain-image-") as context:
        _project_context(Path(context))
        _docker_build(Path(context), base, tag)
    return tag


def _project_context(context: Path) -> None:
    """python/ (this client's meshtrain and meshtrain_runtime), train, the Dockerfile."""
    runtime = importlib.util.find_spec("meshtrain_runtime")
    if runtime is None or runtime.origin is None:
        raise ConfigError("meshtrain_runtime is not installed beside this client: reinstall "
                          "meshtrain (it ships both packages).")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    shutil.copytree(CLIENT_PACKAGE, context / "python" / "meshtrain",
                    ignore=ignore)
    shutil.copytree(Path(runtime.origin).parent, context / "python" / "meshtrain_runtime",
                    ignore=ignore)
    (context / "train").write_text(TRAIN_SCRIPT)
    (context / "train").chmod(0o755)
    dockerfile = CONTAINERS / "Dockerfile.cpu"
    if not dockerfile.is_file():
        raise ConfigError(f"{dockerfile} is missing: build the image from a meshtrain source "
                          "checkout.")
    shutil.copy(dockerfile, context / "Dockerfile")


def _docker_build(context: Path, base: str, tag: str) -> None:
    result = subprocess.run(
        [docker_binary(), "build", "--network", "none", "--build-arg", f"BASE_IMAGE={base}",
         "--build-arg", f"MESHTRAIN_VERSION={__version__}", "-t", tag, str(context)],
        env=_build_env(), capture_output=True, text=True, timeout=BUILD_TIMEOUT, check=False)
    if result.returncode:
        raise RuntimeError(f"docker build of {tag} failed:\n{result.stdout[-2000:]}"
                           f"{result.stderr[-2000:]}")


def _build_env() -> dict[str, str]:
    import os

    return {**os.environ, "DOCKER_BUILDKIT": "0"}  # the classic builder: no buildx needed


def build_base(tag: str) -> None:
    """mmdebstrap | docker import: Debian + python3 + torch, numpy, pydantic, pip (no registry)."""
    if shutil.which("mmdebstrap") is None:
        raise ConfigError("building meshtrain's image needs mmdebstrap (the mmdebstrap "
                          "package), or pass --base IMAGE with an image that has python3, torch "
                          "and pydantic.")
    with tempfile.TemporaryDirectory(prefix="meshtrain-base-") as scratch:
        hook = Path(scratch) / "hook.sh"
        hook.write_text(_pip_hook())
        command = ["mmdebstrap", "--variant=essential", f"--include={ESSENTIALS}",
                   f"--customize-hook=sh {shlex.quote(str(hook))} \"$1\"",
                   "--customize-hook=rm -rf \"$1\"/var/cache/apt/* \"$1\"/var/lib/apt/lists/*",
                   _host_suite(), "-", *_host_sources()]
        debootstrap = subprocess.Popen(command, stdout=subprocess.PIPE,
                                       stderr=subprocess.PIPE)
        imported = subprocess.run([docker_binary(), "import", "-", tag], stdin=debootstrap.stdout,
                                  capture_output=True, timeout=BUILD_TIMEOUT, check=False)
        debootstrap.stdout.close()
        errors = debootstrap.stderr.read().decode(errors="replace")
        if debootstrap.wait() or imported.returncode:
            raise RuntimeError(f"building {tag} failed: mmdebstrap: {errors[-3000:]}\n"
                               f"docker import: {imported.stderr.decode(errors='replace')}")


def _requirements() -> list[str]:
    """torch at the version this client has (if any), numpy, pydantic, and pip (SageMaker SDK
    v3's drivers install requirements with it)."""
    try:
        torch = f"torch=={importlib.metadata.version('torch').split('+')[0]}"
    except importlib.metadata.PackageNotFoundError:
        torch = "torch>=2.13.0"
    return [torch, "numpy>=1.24", "pydantic>=2.6", "pip"]


WARM_MODULES = ("torch", "torch.distributed.run", "torch.distributed.fsdp",
                "torch.distributed.checkpoint", "torch.distributed.tensor", "numpy", "pydantic")
BYTECODE = (
    "import importlib, py_compile, sys\n"
    "for name in sys.argv[1:]:\n"
    "    importlib.import_module(name)\n"
    "for module in list(sys.modules.values()):\n"
    "    path = getattr(module, '__file__', None) or ''\n"
    "    if path.endswith('.py') and '/dist-packages/' in path:\n"
    "        py_compile.compile(path, doraise=False, quiet=2,\n"
    "                           invalidation_mode=py_compile.PycInvalidationMode.UNCHECKED_HASH)\n")


def _pip_hook() -> str:
    """Runs on this machine with the chroot as $1: pip-installs the requirements for the
    chroot's own Python version into its dist-packages, then writes byte-code for what a job
    imports (unchecked-hash .pyc: the tarball's normalised mtimes would make timestamp-checked
    ones stale, and every rank would compile torch again at import, ~2x slower)."""
    pip = f"{shlex.quote(sys.executable)} -m pip"
    requirements = " ".join(shlex.quote(r) for r in _requirements())
    return ("set -e\n"
            "V=$(chroot \"$1\" python3 -c 'import sys; print(\"%d.%d\" % sys.version_info[:2])')\n"
            f"{pip} install --quiet --no-compile --target \"$1/usr/local/lib/python$V/"
            f"dist-packages\" --python-version \"$V\" --only-binary=:all: {requirements}\n"
            f"cat > \"$1/tmp/bytecode.py\" <<'EOF'\n{BYTECODE}EOF\n"
            f"chroot \"$1\" python3 /tmp/bytecode.py {' '.join(WARM_MODULES)}\n"
            "rm -f \"$1/tmp/bytecode.py\"\n")


def _host_suite() -> str:
    """This machine's Debian release (its codename from /etc/os-release)."""
    for line in Path("/etc/os-release").read_text().splitlines():
        if line.startswith("VERSION_CODENAME="):
            return line.split("=", 1)[1].strip('"')
    raise ConfigError("cannot tell this machine's Debian release (/etc/os-release has no "
                      "VERSION_CODENAME): pass --base IMAGE.")


def _host_sources() -> list[str]:
    """The host's apt source files that name a Debian archive (used as mmdebstrap mirrors)."""
    candidates = [Path("/etc/apt/sources.list"),
                  *sorted(Path("/etc/apt/sources.list.d").glob("*.sources")),
                  *sorted(Path("/etc/apt/sources.list.d").glob("*.list"))]
    found = [str(p) for p in candidates if p.is_file() and "/debian" in _active_text(p)]
    if not found:
        raise ConfigError("no Debian apt sources on this machine for mmdebstrap: pass --base "
                          "IMAGE.")
    return found


def _active_text(path: Path) -> str:
    return "\n".join(line for line in path.read_text(errors="replace").splitlines()
                     if line.strip() and not line.lstrip().startswith("#"))


def image_version(image: str) -> str | None:
    """The meshtrain version an image was built for (its label), None if it has none."""
    out = docker("image", "inspect", "--format", '{{ index .Config.Labels "meshtrain.version" }}',
                 image, check=False).strip()
    return out if out and out != "<no value>" else None
