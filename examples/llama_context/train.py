"""A tiny Llama trained with context parallelism (cp2): every sequence split over the cp ranks.

Runs on every rank under torchrun. ``meshtrain_runtime.transform`` shards Hugging Face's
``LlamaForCausalLM`` (built from a tiny config, nothing downloaded) with FSDP2 over the
sharding group, which holds the cp group, and routes its attention through meshtrain's
context-parallel attention (``cp_comm_type`` from the distribution). Every cp rank passes the
same FULL rows to ``forward_backward``; it keeps this rank's chunks of each sequence, gives the
model their global positions, and weights each rank's loss by its share of the targets, so the
loss and the gradients are one process's over the whole sequences. The rows come from
``meshtrain_runtime.data.loader("train", ...)``: the ``train`` channel's text as UTF-8 bytes.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime
from meshtrain_runtime import metrics


def tiny_config(vocab_size: int) -> LlamaConfig:
    """Llama at toy size (grouped-query attention: 4 heads, 2 key/value heads)."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_cache=False)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of the tokens given (targets already shifted)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=64, help="divisible by 2 x cp")
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    state = meshtrain_runtime.init()
    if state.rank == 0:
        print(f"layout: cp={state.cp_size} ({state.config.cp_comm_type}) x dp={state.dp_size}: "
              f"each rank holds {args.seq_len // state.cp_size} of every {args.seq_len} tokens",
              flush=True)
    loader = meshtrain_runtime.data.loader("train", global_batch_size=args.global_batch,
                                           seq_len=args.seq_len, steps=args.steps)
    torch.manual_seed(0)  # every rank builds the same weights
    model = meshtrain_runtime.transform(LlamaForCausalLM(tiny_config(loader.vocab_size)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step, (inputs, targets) in enumerate(loader):  # the cp ranks of a dp rank: the same rows
        loss = meshtrain_runtime.forward_backward(model, inputs, targets, loss_fn=loss_fn)
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        metrics.log(step=step, loss=losses[-1])

    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
