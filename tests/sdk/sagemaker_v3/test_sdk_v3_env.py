"""The SDK v3 environment's build: a step that fails is a skip with its output on a developer's
machine and a failure under CI=true (the tier must not vanish in CI)."""

from __future__ import annotations

import sys

import pytest
import sdk_v3_env

FAILING = [sys.executable, "-c", "import sys; print('no such version'); sys.exit(3)"]


def test_a_failed_build_step_fails_under_ci(monkeypatch):
    monkeypatch.setenv("CI", "true")
    with pytest.raises(pytest.fail.Exception, match=r"(?s)no such version.*CI=true"):
        sdk_v3_env._run(FAILING, "pip install sagemaker==3.27.0")


def test_a_failed_build_step_skips_on_a_developer_machine(monkeypatch):
    monkeypatch.delenv("CI", raising=False)
    with pytest.raises(pytest.skip.Exception, match="exit 3"):
        sdk_v3_env._run(FAILING, "pip install sagemaker==3.27.0")


def test_the_cached_environment_is_rebuilt_unless_it_is_ready(monkeypatch, tmp_path):
    built = []
    monkeypatch.setattr(sdk_v3_env, "SDK_DIR", tmp_path / "sdk")
    monkeypatch.setattr(sdk_v3_env, "_build", lambda python: built.append(python))
    sdk_v3_env.sdk_python()
    (tmp_path / "sdk").mkdir()
    (tmp_path / "sdk" / "ready").write_text("sagemaker==3.27.0\n")
    assert sdk_v3_env.sdk_python() == tmp_path / "sdk" / "bin" / "python"
    assert built == [tmp_path / "sdk" / "bin" / "python"]  # built once, then reused
