"""The `gpu` tier: every CUDA code path of the runtime on one GPU, each against eager / fp32.

Without a CUDA device every test here skips with the reason "needs a GPU" (the one skip CI
accepts, tests/ci_guards.py). ``make gpu-check`` (benchmarks/gpu_check.py) runs the tier on a
lent GPU; its CPU smoke run (``make gpu-check-smoke``) sets ``MESHTRAIN_GPU_CHECK_ON_CPU=1`` so
that the cases whose arithmetic also runs on CPU run there on tiny shapes, and the CUDA-only
ones still skip with "needs a GPU".

A case may record figures (`record_property("figure", ...)`): gpu_check.py reads them from the
JUnit XML into its report. Figures are reported, never held to a bound here.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from typing import Any

import pytest
import torch
from gpu_models import CPU_SHAPE, GPU_SHAPE, Shape

ON_CPU_VARIABLE = "MESHTRAIN_GPU_CHECK_ON_CPU"
_LAUNCH_VARIABLES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                     "MASTER_PORT", "GROUP_RANK", "TORCHELASTIC_RUN_ID", "SM_HP_MP_PARAMETERS",
                     "SM_HOST_COUNT")


@pytest.fixture
def device() -> torch.device:
    """The CUDA device; the CPU in the smoke run (MESHTRAIN_GPU_CHECK_ON_CPU=1); else skip."""
    if torch.cuda.is_available():
        return torch.device("cuda", 0)
    if os.environ.get(ON_CPU_VARIABLE) == "1":
        return torch.device("cpu")
    pytest.skip("needs a GPU")


@pytest.fixture
def cuda_device(device: torch.device) -> torch.device:
    """A case whose path exists only on CUDA (also skipped in the CPU smoke run)."""
    if device.type != "cuda":
        pytest.skip("needs a GPU (a CUDA-only path; the CPU smoke run leaves it out)")
    return device


@pytest.fixture
def shape(device: torch.device) -> Shape:
    return GPU_SHAPE if device.type == "cuda" else CPU_SHAPE


@pytest.fixture
def runtime(monkeypatch: pytest.MonkeyPatch) -> Iterator[Any]:
    """meshtrain_runtime, uninitialised, in a single-process environment (a world of one)."""
    import meshtrain_runtime
    from meshtrain_runtime import state

    for name in _LAUNCH_VARIABLES:
        monkeypatch.delenv(name, raising=False)
    state.reset(destroy_process_group=True)
    yield meshtrain_runtime
    state.reset(destroy_process_group=True)
    if torch.cuda.is_available():
        torch.cuda.empty_cache()
