"""examples/llama_context runs as a user runs it: a tiny Llama with context_parallel_degree 2
(ring attention) through the Estimator on one local host of 2 processes, and its losses are one
process's on the same whole sequences (fp32, within 1e-5)."""

from __future__ import annotations

from pathlib import Path

import pytest
from test_examples import check_training, one_process_losses, run_example


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_llama_context_parallel(tmp_path: Path) -> None:
    stdout = run_example("llama_context/launch.py", tmp_path)
    assert "layout: cp=2 (p2p) x dp=1: each rank holds 32 of every 64 tokens" in stdout
    values = check_training(stdout, steps=8, drop=0.6)
    reference = one_process_losses("llama_context", global_batch=4, seq_len=64, steps=8)
    assert max(abs(a - b) for a, b in zip(values, reference, strict=True)) <= 1e-5, (
        values, reference)
