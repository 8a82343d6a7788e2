"""Llama with tensor parallelism inside each host and hybrid sharding: 2 local hosts.

    python examples/llama_tp_hsdp/launch.py                          # 2 hosts x 2 processes
    python examples/llama_tp_hsdp/launch.py --processes-per-host 4   # 2 hosts x 4 processes

Ranks are laid out replicate x shard x tp with TP innermost, so every TP pair sits on one host.
With 2 processes per host: tp=2 inside each host and the two hosts are replicas
(hybrid_shard_degree=1). With 4: tp=2 x hybrid_shard_degree=2 x 2 replicas, the layout of
README.md's p4d example at toy size (8 ranks; slow on a 2-core machine).
"""

import argparse
from pathlib import Path

from meshtrain import Estimator

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the `train` channel's text

TENSOR_PARALLEL_DEGREE = 2

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--processes-per-host", type=int, default=2)
parser.add_argument("--steps", type=int, default=12)
args = parser.parse_args()

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="llama-tp-hsdp",  # names the jobs llama-tp-hsdp-<time>
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker (8 GPUs per host)
    instance_count=2,
    hyperparameters={"steps": args.steps, "lr": 1e-2, "global-batch": 8},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": args.processes_per_host},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "tensor_parallel_degree": TENSOR_PARALLEL_DEGREE,  # each layer split over 2 ranks
            # shard over the TP groups of one host, replicate across hosts (SMP's hybrid)
            "hybrid_shard_degree": args.processes_per_host // TENSOR_PARALLEL_DEGREE,
        }}},
    },
)
estimator.fit(inputs={"train": str(CORPUS)})
print(f"Model artifacts: {estimator.model_data}")
