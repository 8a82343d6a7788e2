"""The walk of `distribution` from Estimator to the host (issue 13): parsed once per side.

The client parses the user's dict once (Estimator) and encodes it into hyperparameters; the
job spec crosses to the supervisor as JSON (the one edge where a dict is read back); the host
decodes the hyperparameters once, however often it asks. Counted by wrapping the contract's
two readers, `DistributionConfig.from_dict` and `decode_distribution`; a second parse on
either side fails here. The host side is torch-free, so this runs in the client's process.
"""

from __future__ import annotations

from collections import Counter

import pytest

from meshtrain import Estimator
from meshtrain.contract import OptMLPaths
from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.jobspec import JobSpec, write_host_config
from meshtrain_runtime.host import bootstrap
from meshtrain_runtime.host.contract import HostContract

SMP = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
       "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
           "hybrid_shard_degree": 2, "tensor_parallel_degree": 2}}}}


@pytest.fixture
def parses(monkeypatch) -> Counter:
    counts: Counter = Counter()
    from_dict = DistributionConfig.from_dict.__func__
    decode = hp.decode_distribution

    def counting_from_dict(cls, *args, **kwargs):
        counts["from_dict"] += 1
        return from_dict(cls, *args, **kwargs)

    def counting_decode(*args, **kwargs):
        counts["decode"] += 1
        return decode(*args, **kwargs)

    monkeypatch.setattr(DistributionConfig, "from_dict", classmethod(counting_from_dict))
    monkeypatch.setattr(hp, "decode_distribution", counting_decode)
    monkeypatch.setenv("MESHTRAIN_NUM_GPUS", "0")
    return counts


def test_client_parses_once_and_host_decodes_once(parses, tmp_path):
    (tmp_path / "train.py").write_text("")
    estimator = Estimator("train.py", source_dir=str(tmp_path), instance_count=2,
                          distribution=SMP)
    spec = estimator.build_spec()
    spec.container_hyperparameters("file:///none")  # the client encodes
    assert parses == {"from_dict": 1}
    assert spec.distribution is estimator.distribution_config  # handed on, not re-read

    crossed = JobSpec.from_json(spec.to_json())  # the supervisor reads the spec file
    assert parses == {"from_dict": 2}

    paths = OptMLPaths(tmp_path / "algo-2" / "opt" / "ml")
    write_host_config(crossed, paths.input_config_dir, "algo-2", "file:///none")
    contract = HostContract.read(paths)
    for _ in range(3):
        assert contract.distribution() == estimator.distribution_config
    assert contract.processes_per_host == 2
    bootstrap.build_command(contract, contract.paths.code_dir / "train.py")
    assert parses == {"from_dict": 3, "decode": 1}
