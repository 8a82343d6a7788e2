"""Entry point of the planner-calibration launches (one 2-rank, one 4-rank torchrun).

Every rank runs the model-state cases of its world size (calib_states.py); the 2-rank launch
also runs the activation cases (calib_activations.py). Records go through report.py.
"""

from __future__ import annotations

import torch.distributed as dist
from calib_activations import run_activation_cases
from calib_states import run_state_cases

import meshtrain_runtime as mr


def main() -> None:
    mr.init({})  # starts the process group; every case re-initialises with its own parameters
    world_size = dist.get_world_size()
    mr.reset()
    run_state_cases(world_size)
    if world_size == 2:
        run_activation_cases()


if __name__ == "__main__":
    main()
