"""Quickstart: a 2-host x 2-process hybrid-sharded training job on local processes.

    python examples/quickstart/launch.py

The job trains on the repository's small text corpus (examples/data/corpus), given to it as
the `train` channel. The same Estimator call with instance_type="ml.p4d.24xlarge", a role and
an S3 URI for the channel runs on SageMaker.
"""

from pathlib import Path

from meshtrain import Estimator

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # train.jsonl: {"text": ...}

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="quickstart",  # names the jobs quickstart-<time>
    instance_type="local",
    instance_count=2,
    hyperparameters={"steps": 20, "lr": 3e-3},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 2,  # shard within each host, replicate across the two
        }}},
    },
)
estimator.fit(inputs={"train": str(CORPUS)})
print(f"Model artifacts: {estimator.model_data}")
