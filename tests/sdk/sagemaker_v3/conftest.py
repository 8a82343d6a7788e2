"""Fixtures of the SDK v3 tests: moto over HTTP (as for the SDK v2 drop-in), and the real
SDK v3 in its own environment (sdk_v3_env.py)."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(HERE.parent / "backends" / "sagemaker"))

from sagemaker_moto import RecordingMotoServer, point_boto3_at  # noqa: E402


@pytest.fixture(scope="session")
def moto_server():
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = RecordingMotoServer()
    server.start()
    yield server
    server.stop()


@pytest.fixture
def aws(moto_server, monkeypatch, tmp_path):
    """A clean moto and an environment whose only AWS configuration points boto3 at it."""
    point_boto3_at(moto_server, monkeypatch, tmp_path)
    moto_server.reset()
    return moto_server
