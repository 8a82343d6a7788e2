"""The fake API server, a kubeconfig for it and an Estimator that submits to it."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from meshtrain import Estimator

from .crd import require_schemas
from .fake_apiserver import FakeApiServer

IMAGE = "123456789012.dkr.ecr.us-west-2.amazonaws.com/meshtrain:0.1"


@pytest.fixture
def server():
    require_schemas()  # the fake server validates every posted job against the CRDs
    with FakeApiServer() as fake:
        yield fake


@pytest.fixture
def kubeconfig(server, tmp_path) -> Path:
    path = tmp_path / "kubeconfig"
    path.write_text(json.dumps({  # a kubeconfig is YAML; JSON is YAML
        "apiVersion": "v1", "kind": "Config", "current-context": "other",
        "clusters": [{"name": "fake", "cluster": {"server": server.url}}],
        "users": [{"name": "tester", "user": {"token": "t0ken"}}],
        "contexts": [{"name": "fake", "context": {"cluster": "fake", "user": "tester"}},
                     {"name": "other", "context": {"cluster": "nowhere", "user": "tester"}}],
    }))
    return path


@pytest.fixture
def estimator(tmp_path, kubeconfig) -> Estimator:
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('training')\n")
    return Estimator("train.py", source_dir=str(src), instance_type="k8s:ml.p4d.24xlarge",
                     instance_count=2, image_uri=IMAGE, hyperparameters={"max_steps": 10},
                     distribution={"torch_distributed": {"enabled": True}},
                     namespace="training", kubeconfig=str(kubeconfig), kube_context="fake")
