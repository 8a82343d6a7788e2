"""Quickstart training script: a tiny transformer language model on the `train` channel's text.

Runs on every rank under torchrun. `meshtrain_runtime.init()` reads the distribution the
Estimator sent (SM_HP_MP_PARAMETERS) and `transform(model)` shards the model with FSDP2 as
`hybrid_shard_degree` asks. `meshtrain_runtime.data.loader("train", ...)` reads the channel's
.jsonl text as UTF-8 bytes, packs it into samples of seq_len + 1 tokens and hands each
data-parallel rank its rows of every global batch. The same script runs unchanged on SageMaker.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

import meshtrain_runtime
from meshtrain_runtime.metrics import log_metric


class Block(nn.Module):
    def __init__(self, dim: int, heads: int) -> None:
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(dim), nn.LayerNorm(dim)
        self.attn = nn.MultiheadAttention(dim, heads, batch_first=True)
        self.mlp = nn.Sequential(nn.Linear(dim, 4 * dim), nn.GELU(), nn.Linear(4 * dim, dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        seq = x.shape[1]
        causal = torch.triu(torch.ones(seq, seq, dtype=torch.bool, device=x.device), 1)
        h = self.norm1(x)
        x = x + self.attn(h, h, h, attn_mask=causal, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class TinyLM(nn.Module):
    def __init__(self, vocab: int, dim: int, layers: int, heads: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, dim)
        self.layers = nn.ModuleList(Block(dim, heads) for _ in range(layers))
        self.norm = nn.LayerNorm(dim)
        self.head = nn.Linear(dim, vocab)

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """Next-token cross-entropy of `tokens` against `targets`."""
        x = self.embed(tokens)
        for layer in self.layers:
            x = layer(x)
        logits = self.head(self.norm(x))
        return nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--global-batch-size", type=int, default=16)
    parser.add_argument("--seq-len", type=int, default=64)
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    state = meshtrain_runtime.init()
    loader = meshtrain_runtime.data.loader("train", global_batch_size=args.global_batch_size,
                                           seq_len=args.seq_len, steps=args.steps)
    torch.manual_seed(0)
    model = meshtrain_runtime.transform(TinyLM(loader.vocab_size, dim=64, layers=2, heads=4))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    losses = []
    for step, (inputs, targets) in enumerate(loader):  # this rank's rows of each global batch
        loss = model(inputs, targets)
        loss.backward()
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        log_metric("train:loss", losses[-1], step=step)  # the step's one line: SageMaker's metric

    weights = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True,
                                                                   cpu_offload=True))
    if state.rank == 0:
        torch.save(weights, os.path.join(os.environ.get("SM_MODEL_DIR", "."), "model.pt"))
        print(f"saved model to {os.environ.get('SM_MODEL_DIR')}", flush=True)
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))  # packed into output.tar.gz
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
