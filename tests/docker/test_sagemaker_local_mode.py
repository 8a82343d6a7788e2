"""A client nobody here wrote: the SageMaker Python SDK v2 in its own local mode (LocalSession,
instance_type="local", docker-compose) runs a 2-instance torch_distributed job on meshtrain's
image and writes model.tar.gz. This is what a SageMaker user's existing notebook does."""

from __future__ import annotations

import shutil
import tarfile
from pathlib import Path

import pytest

HERE = Path(__file__).parent


def test_sagemaker_sdk_local_mode_trains_on_meshtrains_image(meshtrain_image, tmp_path,
                                                             monkeypatch, capfd):
    pytest.importorskip("sagemaker", reason="the SageMaker SDK (dev extra) is not installed")
    if shutil.which("docker-compose") is None:
        pytest.skip("no docker-compose (the docker-compose package) for SageMaker local mode")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")
    monkeypatch.setenv("SAGEMAKER_SUPPRESS_V2_WARNING", "1")
    monkeypatch.chdir(tmp_path)
    from sagemaker.local import LocalSession
    from sagemaker.pytorch import PyTorch

    session = LocalSession()
    session.config = {"local": {"local_code": True, "container_root": str(tmp_path)}}
    estimator = PyTorch(entry_point="sagemaker_train.py", source_dir=str(HERE / "scripts"),
                        role="arn:aws:iam::111111111111:role/meshtrain-test",
                        image_uri=meshtrain_image, instance_type="local", instance_count=2,
                        sagemaker_session=session, output_path=f"file://{tmp_path / 'out'}",
                        distribution={"torch_distributed": {"enabled": True}},
                        environment={"OMP_NUM_THREADS": "1"})
    estimator.fit(wait=True)

    log = capfd.readouterr().out
    assert "rank 1 of 2" in log and "rank 0 of 2" in log  # one process on each instance
    model = Path(estimator.model_data.removeprefix("file://"))
    assert model == tmp_path / "out" / "model.tar.gz"
    with tarfile.open(model) as tar:
        assert "model.pt" in tar.getnames()
