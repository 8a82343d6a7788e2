"""`compile: true` against the same layout uncompiled: one 4-rank gloo launch, CPU inductor.

This file is its own worker (``__main__``). Cases (each: tiny HF model, same seed, 3 AdamW steps
on the same per-rank batches, with and without ``compile``):

- full shard over 4 ranks, with activation checkpointing;
- hybrid 2 x 2 (replicate, shard), with activation checkpointing, full and selective (torch's
  selective checkpointing contexts inside the compiled block);
- ep 2 (Mixtral, 4 experts top-2) with FSDP2 over the rest (dynamo breaks the graph at the
  data-dependent all-to-all; the dense parts are compiled);
- tp 2 x hybrid 2 (tensor parallelism inside, FSDP2 over the other 2 ranks) and tp 2 with
  sequence parallelism (the residual stream enters each compiled block as a DTensor).

One more case checks that torch still needs meshtrain's workaround for TP: without the wait
on the embedding's pending all-reduce (`compile._plain_collective_inputs`), the first backward
still fails. When that case fails, torch is fixed and the workaround can go.
TP with checkpointing, and EP with checkpointing, are ConfigErrors (see test_compile_config.py
and docs/performance.md for why).

Bound: float32 loss within 1e-4 of the uncompiled run. Inductor fuses and reorders float32
reductions (RMSNorm, softmax, the loss' log-sum-exp), which changes the last bits of each
step (~1e-7 relative); 3 AdamW steps at lr 1e-2 amplify that (Adam divides by sqrt(v), so a
tiny gradient change can move a weight by a sizeable fraction of lr). 1e-4 is far below the
loss change of one step (~1e-1) and would catch a wrong layout or a missing gradient.
The same bound holds for the TP cases: their compiled blocks contain the same fused float32
reductions, plus the TP all-reduces, which gloo sums in the same order with and without compile.
The first step's compile-time line is checked too (it goes to stderr once), and every case but
ep2 must compile without a graph break (a break inside a block means part of it ran eagerly).
"""

from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from typing import Any

import pytest

WORKER = Path(__file__).resolve()
BOUND = 1e-4
# full shard + checkpointing is hybrid2x2_ac's FSDP2 path on one more mesh axis: left out (the
# launch took 111 s in CI with it; each case compiles afresh)
CASES = ("hybrid2x2_ac", "hybrid2x2_selective", "ep2", "tp2_x_hybrid2", "tp2_sp", "tp4")
UNFIXED = "tp4_without_wait"


@pytest.fixture(scope="module")
def records(torchrun: Any) -> dict[str, dict[str, Any]]:
    out = torchrun(WORKER, 4, timeout=1800)  # 5 cases compiled on every rank: minutes
    rank0 = {r["case"]: r for r in out if r["rank"] == 0}
    print(rank0)  # measured figures (pytest -s)
    return rank0


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", CASES)
def test_compiled_loss_matches_uncompiled(records: dict[str, dict[str, Any]], case: str) -> None:
    record = records[case]
    assert "error" not in record, record.get("error")
    assert record["max_loss_diff"] < BOUND, record
    assert record["compiled_blocks"] == record["blocks"] > 0
    assert record["graphs"] > 0  # dynamo really captured graphs (not an eager fallback)
    assert "meshtrain: compile=True: first step" in record["log"], record["log"]
    if case != "ep2":
        assert record["graph_breaks"] == 0, record


@pytest.mark.multiprocess
def test_tp_compile_still_needs_the_wait(records: dict[str, dict[str, Any]]) -> None:
    """torch 2.13, TP alone: with the embedding's AsyncCollectiveTensor fed to a compiled
    block, the embedding's Redistribute backward receives a plain-tensor gradient and raises.
    If this fails, torch no longer needs
    `_plain_collective_inputs`: remove it (and this test)."""
    record = records[UNFIXED]
    assert "error" not in record, record.get("error")
    assert "'Tensor' object has no attribute '_local_tensor'" in record["raised"], record


# ------------------------------------------------------------------ worker (on each rank)

PARAMS = {
    "hybrid2x2_ac": ({"hybrid_shard_degree": 2, "activation_checkpointing": True}, "llama"),
    "hybrid2x2_selective": ({"hybrid_shard_degree": 2, "activation_checkpointing": "selective"},
                            "llama"),
    "ep2": ({"expert_parallel_degree": 2}, "mixtral"),
    "tp2_x_hybrid2": ({"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}, "llama"),
    "tp2_sp": ({"tensor_parallel_degree": 2, "sequence_parallel": True}, "llama"),
    "tp4": ({"tensor_parallel_degree": 4}, "llama_mha"),  # TP alone: no FSDP around blocks
}


def _build(kind: str):
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

    small = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, vocab_size=64,
                 num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=16)
    torch.manual_seed(0)
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**small, num_local_experts=4,
                                                num_experts_per_tok=2))
    if kind == "llama_mha":  # 4 kv heads: tp 4 holds whole heads
        return LlamaForCausalLM(LlamaConfig(**{**small, "num_key_value_heads": 4}))
    return LlamaForCausalLM(LlamaConfig(**small))


def _train(params: dict[str, Any], kind: str, steps: int = 3) -> tuple[list[float], str, Any]:
    import torch
    import torch.distributed as dist

    import meshtrain_runtime as mr

    mr.reset()
    mr.init(params)
    model = mr.transform(_build(kind))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(mr.state.dp_rank))
    losses, log = [], io.StringIO()
    for _ in range(steps):
        with contextlib.redirect_stderr(log):
            loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        value = loss.detach().reshape(1).clone()
        dist.all_reduce(value)
        losses.append(float(value) / dist.get_world_size())
    return losses, log.getvalue(), model


def _case(name: str) -> dict[str, Any]:
    import torch
    from torch._dynamo.utils import counters

    params, kind = PARAMS[name]
    eager, _, _ = _train(params, kind)
    torch._dynamo.reset()  # each case compiles afresh (no reuse of an earlier case's graphs)
    graphs = counters["stats"]["unique_graphs"]
    breaks = sum(counters["graph_break"].values())
    compiled, log, model = _train({**params, "compile": True}, kind)
    blocks = list(model.model.layers)
    return {"graphs": counters["stats"]["unique_graphs"] - graphs,
            "graph_breaks": sum(counters["graph_break"].values()) - breaks,
            "max_loss_diff": max(abs(a - b) for a, b in zip(eager, compiled, strict=True)),
            "eager": eager, "compiled": compiled, "log": log, "blocks": len(blocks),
            "compiled_blocks": sum(b._compiled_call_impl is not None for b in blocks)}


def _without_wait() -> dict[str, Any]:
    """One compiled tp 4 step with the workaround switched off; what the backward raised.

    TP alone (tp = world size): with FSDP2 over the blocks as well (tp 2 on 4 ranks) the same
    step ran without the wait and raised nothing, in this session."""
    import torch

    from meshtrain_runtime.parallel import compile as compile_module

    torch._dynamo.reset()
    keep = compile_module._plain_collective_inputs
    compile_module._plain_collective_inputs = lambda compiled: compiled
    try:
        _train({"tensor_parallel_degree": 4, "compile": True}, "llama_mha", steps=1)
    except Exception as error:  # the record says what was raised
        return {"raised": f"{type(error).__name__}: {error}"}
    finally:
        compile_module._plain_collective_inputs = keep
    return {"raised": ""}


def main() -> None:
    sys.path.insert(0, str(WORKER.parent / "workers"))
    from report import report_cases

    cases = [(name, lambda name=name: _case(name)) for name in CASES]
    report_cases([*cases, (UNFIXED, _without_wait)])


if __name__ == "__main__":
    main()
