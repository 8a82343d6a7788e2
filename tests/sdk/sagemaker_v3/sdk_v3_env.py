"""The real SageMaker Python SDK v3 (sagemaker==3.27.0) in a virtual environment of its own.

SDK v3 cannot share the test environment with SDK v2 (the `dev` extra pins 2.257.7, which needs
sagemaker-core < 2), so it gets its own venv under ~/.cache/meshtrain-tests, built once from
the package registry by the first test that needs it (the SDK pulls in mlflow, pandas and scipy;
sdk_v3_constraints.txt pins a working resolution, so pip does not backtrack for minutes) and
reused by later runs, as the SageMaker training toolkit's environment is
(tests/sdk/backends/sagemaker/test_sagemaker_toolkit_image.py). A file lock lets test files on
several xdist workers wait for one build. When the build fails the tier cannot run: a skip with
pip's output on a developer's machine, a failure under CI=true (tests/ci_guards.py).
"""

from __future__ import annotations

import fcntl
import os
import subprocess
import sys
from pathlib import Path

from ci_guards import missing_component

SDK_VERSION = "3.27.0"
SDK_REQUIREMENT = f"sagemaker=={SDK_VERSION}"
SDK_DIR = Path.home() / ".cache" / "meshtrain-tests" / f"sagemaker-sdk-{SDK_VERSION}"
CONSTRAINTS = Path(__file__).resolve().parent / "sdk_v3_constraints.txt"
"""The versions of a working resolution, so that pip does not backtrack for minutes."""
BUILD_TIMEOUT = 1800
PROBE = ("import sagemaker.train.model_trainer, sagemaker.train.distributed, "
         "sagemaker.core.training.configs; import importlib.metadata as m; "
         "print(m.version('sagemaker'))")


def sdk_python() -> Path:
    """The SDK environment's Python, built now if the cache has none (or a broken one)."""
    SDK_DIR.parent.mkdir(parents=True, exist_ok=True)
    python = SDK_DIR / "bin" / "python"
    with open(SDK_DIR.parent / f"{SDK_DIR.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # one build; other workers wait for it
        if not (SDK_DIR / "ready").exists():
            _build(python)
    return python


def _run(command: list[str], what: str) -> str:
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=BUILD_TIMEOUT)
    except subprocess.TimeoutExpired:
        missing_component(f"SageMaker SDK v3 environment: {what} took over {BUILD_TIMEOUT} s")
    if done.returncode:
        missing_component(f"SageMaker SDK v3 environment: {what} failed "
                          f"(exit {done.returncode}):\n{(done.stdout + done.stderr)[-3000:]}")
    return done.stdout


def _build(python: Path) -> None:
    (SDK_DIR / "ready").unlink(missing_ok=True)
    _run([sys.executable, "-m", "venv", "--clear", str(SDK_DIR)], "creating the venv")
    _run([str(python), "-m", "pip", "install", "--quiet", "-c", str(CONSTRAINTS),
          SDK_REQUIREMENT], f"pip install {SDK_REQUIREMENT}")
    version = _run([str(python), "-c", PROBE], "importing the SDK").strip()
    if version != SDK_VERSION:
        missing_component(f"SageMaker SDK v3 environment: installed sagemaker {version}, "
                          f"expected {SDK_VERSION}")
    (SDK_DIR / "ready").write_text(SDK_REQUIREMENT + "\n")


def sdk_environment(base: dict[str, str], config_dir: Path) -> dict[str, str]:
    """What the SDK needs to run without AWS beside moto: no IAM role validation, telemetry
    off (a config file named by SAGEMAKER_USER_CONFIG_OVERRIDE), this test's PATH and AWS
    settings; no test-venv paths leaking into the SDK's imports."""
    config = config_dir / "sagemaker-config.yaml"
    config.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n"
                      "      TelemetryOptOut: true\n")
    env = {key: value for key, value in base.items() if key not in ("PYTHONPATH", "VIRTUAL_ENV")}
    env.update(SAGEMAKER_VALIDATE_ROLE="false", SAGEMAKER_USER_CONFIG_OVERRIDE=str(config),
               PYTHONUNBUFFERED="1", PYTHONDONTWRITEBYTECODE="1")
    return env


if __name__ == "__main__":  # build the cache ahead: python tests/sdk/sagemaker_v3/sdk_v3_env.py
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
    print(sdk_python(), os.path.exists(SDK_DIR / "ready"))
