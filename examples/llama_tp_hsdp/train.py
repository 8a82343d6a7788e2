"""Llama with tensor parallelism inside each host and hybrid sharding across the rest.

Runs on every rank under torchrun. The model is Hugging Face's own ``LlamaForCausalLM`` built
from a tiny config (nothing is downloaded); ``meshtrain_runtime.transform`` splits it with the
config's ``base_model_tp_plan`` over the ``tp`` ranks and shards what remains with FSDP2 over
``("replicate", "shard")``. ``meshtrain_runtime.data.loader("train", ...)`` reads the ``train``
channel's text (UTF-8 bytes, packed into samples of seq_len + 1 tokens) and hands each
data-parallel rank its rows of every global batch: the two ranks of one tensor-parallel group
read the same rows.
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


def tiny_config(vocab_size: int) -> LlamaConfig:
    """Llama's architecture at toy size; README.md says which values a real run uses."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_cache=False)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy (the loader's targets are the inputs shifted by one)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


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
    loader = meshtrain_runtime.data.loader("train", global_batch_size=args.global_batch,
                                           seq_len=args.seq_len, steps=args.steps)
    torch.manual_seed(0)  # every rank builds the same weights before they are split
    model = meshtrain_runtime.transform(LlamaForCausalLM(tiny_config(loader.vocab_size)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    losses = []
    for step, (inputs, targets) in enumerate(loader):  # this dp rank's rows of the global batch
        loss = meshtrain_runtime.forward_backward(model, inputs, targets, loss_fn=loss_fn)
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
