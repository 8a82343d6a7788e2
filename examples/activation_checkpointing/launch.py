"""Activation checkpointing and offloading, switched on from the distribution dict.

    python examples/activation_checkpointing/launch.py

One local host with 2 processes (full sharding over both). Every decoder layer is checkpointed
and its saved input offloaded to host memory, at most 2 layers' inputs back on the device at
once during backward (activation_loading_horizon).
"""

from pathlib import Path

from meshtrain import Estimator

estimator = Estimator(
    entry_point="train.py",
    source_dir=str(Path(__file__).parent),
    base_job_name="activation-checkpointing",  # names the jobs activation-checkpointing-<time>
    instance_type="local",  # "ml.p4d.24xlarge" on SageMaker
    instance_count=1,
    hyperparameters={"steps": 10, "lr": 1e-2, "seq-len": 128},
    distribution={
        "torch_distributed": {"enabled": True, "processes_per_host": 2},
        "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
            "activation_checkpointing": True,     # meshtrain extension: every block
            "activation_offloading": True,        # meshtrain extension: needs checkpointing
            "activation_loading_horizon": 2,      # SMP key: blocks resident in backward
        }}},
    },
)
estimator.fit()
print(f"Model artifacts: {estimator.model_data}")
