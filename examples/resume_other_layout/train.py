"""Train, save a sharded checkpoint, and resume it on whatever layout this job has.

Runs on every rank under torchrun. At start the script looks for the latest completed checkpoint
in ``$SM_CHECKPOINT_DIR`` (the Estimator's ``checkpoint_local_path``) and, if there is one, loads
the model and optimizer into this job's layout: ``torch.distributed.checkpoint`` stores global
shapes, so a checkpoint written by tensor-parallel ranks loads into fully sharded ones (or into
one process). Data follows the global step and is sharded by ``state.dp_rank``, with the same
global batch on every layout, so the resumed run continues the same training run.
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
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=128, use_cache=False)


def global_batch(step: int, rows: int, seq_len: int) -> torch.Tensor:
    """Step `step`'s whole batch: the same on every rank and on every layout."""
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    return (start + torch.arange(seq_len)) % VOCAB


def layout_name(state) -> str:
    return (f"{state.world_size} ranks: tp={state.tp_size} x shard={state.hybrid_shard_degree}"
            f" x replicate={state.replicate_degree}")


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=12, help="train until this global step")
    parser.add_argument("--save-every", type=int, default=6)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    state = meshtrain_runtime.init()
    torch.manual_seed(0)
    model = meshtrain_runtime.transform(LlamaForCausalLM(tiny_config()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)  # after transform

    start, resumed_from = 0, None
    latest = meshtrain_runtime.latest_checkpoint()  # None on a fresh start
    if latest is not None:
        start = meshtrain_runtime.load_checkpoint(latest, model, optimizer)["extra"]["next_step"]
        resumed_from = start
    if state.rank == 0:
        origin = f"resumed at step {start} from {latest}" if latest else "fresh start"
        print(f"layout: {layout_name(state)}; {origin}", flush=True)

    per_rank = args.global_batch // state.dp_size
    steps, losses = [], []
    for step in range(start, args.steps):
        batch = global_batch(step, args.global_batch, args.seq_len)
        ids = batch[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        steps.append(step)
        losses.append(meshtrain_runtime.global_mean(loss))  # tp ranks hold equal values
        log_metric("train:loss", losses[-1], step=step)
        if (step + 1) % args.save_every == 0 or step + 1 == args.steps:
            path = meshtrain_runtime.save_checkpoint(None, model, optimizer, step=step + 1,
                                                     extra={"next_step": step + 1})
            if state.rank == 0:
                print(f"saved checkpoint {path}", flush=True)

    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))
    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({
            "steps": steps, "train:loss": losses, "resumed_from": resumed_from,
            "layout": layout_name(state)}))
        if losses:
            print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
