"""Mixtral with tensor x expert parallelism: 2 local hosts x 2 processes.

    python examples/mixtral_ep/launch.py

tensor_parallel_degree=2 splits attention, embedding and head over the 2 ranks of a host;
expert_parallel_degree=2 is folded over those same ranks (each holds 2 of the 4 experts of
every MoE layer); the two hosts are replicas (hybrid_shard_degree=1). Drop
tensor_parallel_degree and set hybrid_shard_degree=2 for expert parallelism alone.
"""

from pathlib import Path

from meshtrain import Estimator

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="mixtral-ep",  # names the jobs mixtral-ep-<time>
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker (8 GPUs per host)
    instance_count=2,
    hyperparameters={"steps": 12, "lr": 1e-2, "global-batch": 8},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "tensor_parallel_degree": 2,   # attention, embedding, head over a host's 2 ranks
            "expert_parallel_degree": 2,   # experts split over the same 2 ranks
            "hybrid_shard_degree": 1,      # the two hosts are replicas
        }}},
    },
)
estimator.fit()
print(f"Model artifacts: {estimator.model_data}")
