"""JobSpec carries the validated distribution; a dict only at the JSON edge."""

from __future__ import annotations

from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.jobspec import JobSpec

DISTRIBUTION = {"torch_distributed": {"enabled": True, "processes_per_host": 2},
                "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                    "hybrid_shard_degree": 2, "tensor_parallel_degree": 1}}}}


def test_the_distribution_is_typed_and_round_trips_through_json():
    config = DistributionConfig.from_dict(DISTRIBUTION)
    spec = JobSpec(job_name="j", entry_point="train.py", source_dir="/src", distribution=config)
    assert spec.distribution is config and spec.distribution_config() is config  # no re-parse
    text = spec.to_json()
    assert config.to_dict() == DISTRIBUTION  # the JSON edge: the user's dict form
    again = JobSpec.from_json(text)
    assert isinstance(again.distribution, DistributionConfig)
    assert again == spec and again.distribution.raw_parameters == {
        "hybrid_shard_degree": 2, "tensor_parallel_degree": 1}


def test_no_distribution_stays_none_and_means_the_defaults():
    spec = JobSpec(job_name="j", entry_point="train.py", source_dir="/src")
    assert spec.distribution is None
    assert spec.distribution_config() == DistributionConfig()
    assert JobSpec.from_json(spec.to_json()).distribution is None


def test_importing_the_client_warns_nothing():
    """pydantic < 2.10 warned on every import about the field `model_trainer` ("model_" is its
    protected namespace): a warning a user cannot act on. The version tier runs this at
    pydantic's floor."""
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-W", "error", "-c",
                           "import meshtrain, meshtrain.contract.jobspec"],
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0 and done.stderr == "", done.stderr
