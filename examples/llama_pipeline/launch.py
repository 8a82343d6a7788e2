"""Llama with pipeline parallelism x hybrid sharding: 2 local hosts x 2 processes.

    python examples/llama_pipeline/launch.py                     # pp2 x dp2, 1F1B, 4 microbatches
    python examples/llama_pipeline/launch.py --timeline-step 4   # also record step 4's timeline

The mesh is pp x replicate x shard, pipeline outermost: ranks 0-1 (algo-1) hold the first stage
and shard it between them, ranks 2-3 (algo-2) the last stage; the two data-parallel ranks of
each stage are the two processes of a host.
"""

import argparse
from pathlib import Path

from meshtrain import Estimator

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the `train` channel's text

parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
parser.add_argument("--steps", type=int, default=8)
parser.add_argument("--timeline-step", type=int, default=-1)
args = parser.parse_args()

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="llama-pipeline",  # names the jobs llama-pipeline-<time>
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker (8 GPUs per host)
    instance_count=2,
    hyperparameters={"steps": args.steps, "lr": 1e-2, "global-batch": 8,
                     "timeline-step": args.timeline_step},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "pipeline_parallel_degree": 2,  # 2 stages of 2 blocks each
            "hybrid_shard_degree": 2,       # each stage sharded over its 2 ranks
            "pipeline_schedule": "1F1B",
            "microbatches": 4,              # each data-parallel rank's 4 rows: 4 chunks of 1
        }}},
    },
)
estimator.fit(inputs={"train": str(CORPUS)})
print(f"Model artifacts: {estimator.model_data}")
