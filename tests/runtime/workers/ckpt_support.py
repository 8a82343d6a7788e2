"""Model, data and training loop shared by the checkpoint workers and the in-process test.

One tiny HF Llama (seed 0), a fixed global batch per step (GLOBAL_ROWS rows, split over the
data-parallel ranks by ``state.dp_rank``), AdamW. Every layout sees the same global batch, so the
mean of the per-rank losses equals the single-process loss of that step.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from transformers import LlamaConfig, LlamaForCausalLM, MixtralConfig, MixtralForCausalLM

import meshtrain_runtime as mr
from meshtrain_runtime.checkpoint import load_checkpoint, save_checkpoint

VOCAB = 64
SEQ = 8
GLOBAL_ROWS = 4
LR = 1e-2
STEPS_BEFORE = 2  # steps trained before the save
STEPS_AFTER = 2  # steps trained after the load

HYBRID_2X2 = {"hybrid_shard_degree": 2}  # 4 ranks: 2 replicas x shard 2
TP2 = {"tensor_parallel_degree": 2}  # 2 ranks: tensor parallelism alone (no FSDP)
FULL_SHARD: dict[str, Any] = {}  # every rank in one sharding group
TP2_SHARD2 = {"tensor_parallel_degree": 2}  # 4 ranks: tp 2 x shard 2 (the largest shard degree)
TP2_HYBRID2 = {"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}  # 4 ranks (issue 35.9)
EP2 = {"expert_parallel_degree": 2}  # experts split over 2 ranks, carved out of the shard group


def build_model(kind: str = "llama") -> nn.Module:
    """The same tiny Llama (or Mixtral, for expert parallelism) everywhere (seed 0)."""
    sizes = {"hidden_size": 32, "intermediate_size": 48, "num_hidden_layers": 2,
             "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": VOCAB,
             "max_position_embeddings": 32}
    torch.manual_seed(0)
    if kind == "mixtral":
        return MixtralForCausalLM(MixtralConfig(**sizes, num_local_experts=4,
                                                num_experts_per_tok=2))
    return LlamaForCausalLM(LlamaConfig(**sizes))


def global_batch(step: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(1000 + step)
    return torch.randint(0, VOCAB, (GLOBAL_ROWS, SEQ), generator=generator)


def local_rows(batch: torch.Tensor) -> torch.Tensor:
    """This rank's rows: ranks of one tensor-parallel group share them."""
    rows = GLOBAL_ROWS // mr.state.dp_size
    return batch[mr.state.dp_rank * rows : (mr.state.dp_rank + 1) * rows]


def mean_over_dp(loss: torch.Tensor) -> float:
    """The global batch's loss, by the runtime's helper: every parity test here checks it."""
    return mr.global_mean(loss)


def train(model: nn.Module, optimizer: torch.optim.Optimizer, steps: range) -> list[float]:
    """AdamW steps `steps` (their global batches); the global mean loss of each."""
    losses = []
    for step in steps:
        ids = local_rows(global_batch(step))
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(mean_over_dp(loss))
    return losses


def start(params: dict[str, Any], kind: str = "llama") -> tuple[nn.Module, torch.optim.Optimizer]:
    """init(params) + transform: a fresh model of this layout and its optimizer."""
    mr.reset()
    mr.init(params)
    model = mr.transform(build_model(kind))
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def probe_ids() -> torch.Tensor:
    """A fixed batch whose logits compare a trained model with its exported copy."""
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (2, SEQ), generator=generator)


def train_and_save(params: dict[str, Any], root: Path, kind: str = "llama",
                   async_: bool = False, logits: bool = False) -> dict[str, Any]:
    """Layout A: STEPS_BEFORE steps, then save_checkpoint(step=STEPS_BEFORE).

    With `async_`, the save runs in the background while one more step trains (and changes the
    weights): the checkpoint must still hold the state of step STEPS_BEFORE. With `logits`,
    rank 0 also saves the saved model's logits on `probe_ids()` (``<root>/logits.pt``).
    """
    model, optimizer = start(params, kind)
    losses = train(model, optimizer, range(STEPS_BEFORE))
    saved = save_checkpoint(root, model, optimizer, step=STEPS_BEFORE, async_=async_,
                            extra={"layout": params, "next_step": STEPS_BEFORE})
    if async_:
        train(model, optimizer, range(STEPS_BEFORE, STEPS_BEFORE + 1))
        saved = saved.wait()
    record = {"losses": losses, "saved": str(saved)}
    if logits:
        with torch.no_grad():
            out = model(input_ids=probe_ids(), use_cache=False).logits
        if dist.get_rank() == 0:
            torch.save(out.detach().clone(), root / "logits.pt")
        record["logits"] = str(root / "logits.pt")
    return record


def load_and_continue(params: dict[str, Any], path: Path, kind: str = "llama") -> dict[str, Any]:
    """Layout B: load the checkpoint into a fresh model and optimizer, train STEPS_AFTER steps."""
    model, optimizer = start(params, kind)
    info = load_checkpoint(path, model, optimizer)
    first = info["extra"]["next_step"]
    losses = train(model, optimizer, range(first, first + STEPS_AFTER))
    return {"losses": losses, "step": info["step"], "extra": info["extra"],
            "rng_restored": info["rng_restored"],
            "loaded": info["path"]}


def reference_losses(kind: str = "llama") -> list[float]:
    """The uninterrupted single-process run: all steps, the whole global batch, plain model."""
    model = build_model(kind)
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses = []
    for step in range(STEPS_BEFORE + STEPS_AFTER):
        ids = global_batch(step)
        loss = model(input_ids=ids, labels=ids, use_cache=False).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(float(loss.detach()))
    return losses


def reference_weights(steps: int) -> dict[str, torch.Tensor]:
    """The single-process model's parameters after `steps` steps."""
    model = build_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    for step in range(steps):
        ids = global_batch(step)
        model(input_ids=ids, labels=ids, use_cache=False).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    return {name: p.detach().clone() for name, p in model.state_dict().items()}
