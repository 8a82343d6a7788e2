"""Llama with context parallelism: each sequence split over 2 local processes.

    python examples/llama_context/launch.py                          # cp2, ring (p2p) attention
    python examples/llama_context/launch.py --cp-comm-type a2a       # or all_gather

Both processes of the one local host form the context-parallel group: each holds 2 of the 4
equal chunks of every sequence (SMP's load-balanced layout: rank 0 chunks 0 and 3, rank 1
chunks 1 and 2) and attention runs exactly over the whole sequence across them.
"""

import argparse
from pathlib import Path

from meshtrain import Estimator

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the `train` channel's text

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--cp-comm-type", choices=("p2p", "all_gather", "a2a"), default="p2p")
args = parser.parse_args()

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="llama-context",  # names the jobs llama-context-<time>
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker (8 GPUs per host)
    instance_count=1,
    hyperparameters={"steps": args.steps, "lr": 1e-2, "global-batch": 4, "seq-len": 64},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "context_parallel_degree": 2,        # each sequence over 2 ranks
            "cp_comm_type": args.cp_comm_type,   # SMP scripts: tsm.transform(cp_comm_type=...)
        }}},
    },
)
estimator.fit(inputs={"train": str(CORPUS)})
print(f"Model artifacts: {estimator.model_data}")
