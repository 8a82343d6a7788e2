"""The training script of the SageMaker example: a tiny HF Llama, hybrid sharded.

The same file runs as a local job and on SageMaker (meshtrain's image or an AWS PyTorch training
image): ``meshtrain_runtime.init()`` reads the distribution from ``SM_HP_MP_PARAMETERS`` and the
ranks from torchrun, whichever launcher started it. ``log_metric`` prints the lines the job's
``metric_definitions`` turn into SageMaker metrics (CloudWatch, the console, tuning).
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


def build_config(args: argparse.Namespace) -> LlamaConfig:
    """Llama from the hyperparameters: the defaults are a toy; README.md gives real sizes."""
    return LlamaConfig(vocab_size=args.vocab_size, hidden_size=args.hidden_size,
                       intermediate_size=args.intermediate_size,
                       num_hidden_layers=args.num_layers, num_attention_heads=args.num_heads,
                       num_key_value_heads=args.num_kv_heads,
                       max_position_embeddings=args.seq_len, use_cache=False)


def global_batch(step: int, rows: int, seq_len: int, vocab: int) -> torch.Tensor:
    """Synthetic counting sequences (a real job reads SM_CHANNEL_TRAIN instead)."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, vocab, (rows, 1), generator=generator)
    return (start + torch.arange(seq_len)) % vocab


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    for name, default in (("steps", 12), ("global-batch", 8), ("seq-len", 32),
                          ("vocab-size", 128), ("hidden-size", 64), ("intermediate-size", 128),
                          ("num-layers", 2), ("num-heads", 4), ("num-kv-heads", 2)):
        parser.add_argument(f"--{name}", type=int, default=default)
    parser.add_argument("--lr", type=float, default=1e-2)
    args, _ = parser.parse_known_args()  # the SageMaker toolkit also passes --mp_parameters
    return args


def main() -> None:
    args = parse_args()
    state = meshtrain_runtime.init()
    torch.manual_seed(0)
    model = meshtrain_runtime.transform(LlamaForCausalLM(build_config(args)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    per_rank = args.global_batch // state.dp_size
    losses = []
    for step in range(args.steps):
        batch = global_batch(step, args.global_batch, args.seq_len, args.vocab_size)
        ids = batch[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank].to(state.device)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        log_metric("train:loss", losses[-1], step=step)

    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))  # -> model.tar.gz
    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))  # -> output.tar.gz
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
