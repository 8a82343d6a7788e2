"""Llama with tensor parallelism inside each host and hybrid sharding across the rest.

Runs on every rank under torchrun. The model is Hugging Face's own ``LlamaForCausalLM`` built
from a tiny config (nothing is downloaded); ``meshtrain_runtime.transform`` splits it with the
config's ``base_model_tp_plan`` over the ``tp`` ranks and shards what remains with FSDP2 over
``("replicate", "shard")``. Data is sharded by ``state.dp_rank`` / ``state.dp_size``: the two
ranks of one tensor-parallel group read the same rows.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime
from meshtrain_runtime.checkpoint import export_full_state_dict
from meshtrain_runtime.metrics import log_metric

VOCAB = 128


def tiny_config() -> LlamaConfig:
    """Llama's architecture at toy size; README.md says which values a real run uses."""
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_cache=False)


def global_batch(step: int, rows: int, seq_len: int) -> torch.Tensor:
    """Step `step`'s whole batch (the same on every rank): counting sequences mod VOCAB."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    return (start + torch.arange(seq_len)) % VOCAB


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    state = meshtrain_runtime.init()
    if state.rank == 0:
        print(f"layout: tp={state.tp_size} x shard={state.hybrid_shard_degree} x "
              f"replicate={state.replicate_degree} ({state.sharding_strategy}); "
              f"dp_size={state.dp_size}", flush=True)
    torch.manual_seed(0)  # every rank builds the same weights before they are split
    model = meshtrain_runtime.transform(LlamaForCausalLM(tiny_config()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    per_rank = args.global_batch // state.dp_size
    losses = []
    for step in range(args.steps):
        batch = global_batch(step, args.global_batch, args.seq_len)
        ids = batch[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        value = meshtrain_runtime.global_mean(loss)  # tp ranks hold equal values
        losses.append(value)
        log_metric("train:loss", value, step=step)

    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))
    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
