"""Mixtral with expert parallelism: 2 local hosts x 2 processes, 2 experts per rank.

    python examples/mixtral_ep/launch.py

hybrid_shard_degree=2 shards within each host and replicates across the two hosts;
expert_parallel_degree=2 splits the 4 experts of every MoE layer over the 2 ranks of a host.
"""

from pathlib import Path

from meshtrain import Estimator

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker (8 GPUs per host)
    instance_count=2,
    hyperparameters={"steps": 12, "lr": 1e-2, "global-batch": 8},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 2,      # shard inside a host, replicate across hosts
            "expert_parallel_degree": 2,   # experts split over the 2 ranks of a host
        }}},
    },
)
estimator.fit()
print(f"Model artifacts: {estimator.model_data}")
