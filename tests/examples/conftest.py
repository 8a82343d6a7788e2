"""Fixtures for the examples: tests/sdk/backends/sagemaker's moto server and clean AWS
environment.

The SageMaker example and notebook run against the same RecordingMotoServer (moto serving HTTP
on 127.0.0.1) as tests/sdk/backends/sagemaker; its conftest is loaded under its own name and its
`aws` and `moto_server` fixtures are re-exported here, so both directories share one definition.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

_SAGEMAKER_TESTS = Path(__file__).resolve().parents[1] / "sdk" / "backends" / "sagemaker"
if str(_SAGEMAKER_TESTS) not in sys.path:
    sys.path.insert(0, str(_SAGEMAKER_TESTS))  # its conftest imports sagemaker_moto


def _load_sagemaker_conftest():
    spec = importlib.util.spec_from_file_location("sagemaker_tests_conftest",
                                                  _SAGEMAKER_TESTS / "conftest.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


_sagemaker = _load_sagemaker_conftest()
moto_server = _sagemaker.moto_server
aws = _sagemaker.aws
