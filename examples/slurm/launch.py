"""The quickstart job (2 hosts x 2 processes, hybrid sharding) on a Slurm cluster: one sbatch
job of two nodes, one host per node.

    python examples/slurm/launch.py [--partition debug] [--job-name NAME]

Run it where `sbatch` works (a login node); the job directory goes under ~/.meshtrain/jobs
(MESHTRAIN_HOME), which must be on the cluster's shared filesystem, and so must the `train`
channel's corpus (examples/data/corpus, linked into each host's /opt/ml). See docs/slurm.md.
"""

import argparse
from pathlib import Path

from meshtrain import Estimator

CORPUS = Path(__file__).resolve().parents[1] / "data" / "corpus"  # the `train` channel's text

parser = argparse.ArgumentParser()
parser.add_argument("--partition", help="default: the cluster's default partition")
parser.add_argument("--job-name")
args = parser.parse_args()

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).resolve().parents[1] / "quickstart"),
    base_job_name="quickstart-slurm",  # unless --job-name names it
    instance_type="slurm",
    instance_count=2,  # two Slurm nodes: algo-1 on the first, algo-2 on the second
    partition=args.partition,
    hyperparameters={"steps": 4, "lr": 3e-3},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "hybrid_shard_degree": 2,  # shard within each node, replicate across the two
        }}},
    },
    environment={"OMP_NUM_THREADS": "1"},
)
estimator.fit(inputs={"train": str(CORPUS)}, job_name=args.job_name)
print(f"Model artifacts: {estimator.model_data}")
