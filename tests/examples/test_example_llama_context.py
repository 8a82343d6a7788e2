"""examples/llama_context runs as a user runs it: a tiny Llama with context_parallel_degree 2
(ring attention) through the Estimator on one local host of 2 processes, and its losses are one
process's on the same whole sequences (fp32, within 1e-5)."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from test_examples import EXAMPLES, check_training, run_example


def one_process_losses(steps: int) -> list[float]:
    """The example's model, data and optimizer in this process, every sequence whole."""
    import torch
    from transformers import LlamaForCausalLM

    spec = importlib.util.spec_from_file_location("llama_context_train",
                                                  EXAMPLES / "llama_context" / "train.py")
    train = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(train)
    torch.manual_seed(0)
    model = LlamaForCausalLM(train.tiny_config())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(steps):
        batch = train.global_batch(step, 4, 64)
        loss = train.loss_fn(model(batch[:, :-1]).logits, batch[:, 1:])
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


@pytest.mark.e2e
@pytest.mark.multiprocess
def test_llama_context_parallel(tmp_path: Path) -> None:
    stdout = run_example("llama_context/launch.py", tmp_path)
    assert "layout: cp=2 (p2p) x dp=1: each rank holds 32 of every 64 tokens" in stdout
    values = check_training(stdout, steps=8, drop=0.6)
    reference = one_process_losses(8)
    assert max(abs(a - b) for a, b in zip(values, reference, strict=True)) <= 1e-5, (
        values, reference)
