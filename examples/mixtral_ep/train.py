"""Mixtral with tensor x expert parallelism: each rank holds half of every MoE layer's experts.

Runs on every rank under torchrun. The model is Hugging Face's own ``MixtralForCausalLM`` from a
tiny config (nothing is downloaded). ``meshtrain_runtime.transform`` splits attention, embedding
and head over the ``tp`` ranks, the experts over the ``ep`` ranks (tokens reach their experts by
all-to-all; with TP each tp rank dispatches its own share of the rows) and FSDP2 wraps the rest.
The ranks of a tp group read the same rows, chosen by ``state.dp_rank``.
``outputs.aux_loss`` is the load-balancing loss of the whole global batch.
"""

from __future__ import annotations

import argparse
import json
import os
from pathlib import Path

import torch
from transformers import MixtralConfig, MixtralForCausalLM

import meshtrain_runtime
from meshtrain_runtime.checkpoint import export_full_state_dict
from meshtrain_runtime.metrics import log_metrics

VOCAB = 128


def tiny_config() -> MixtralConfig:
    """Mixtral's architecture at toy size (4 experts, top-2); README.md gives the real one."""
    return MixtralConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         num_local_experts=4, num_experts_per_tok=2, router_aux_loss_coef=0.02,
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
        experts = tiny_config().num_local_experts
        print(f"layout: tp={state.tp_size} x ep={state.ep_size} ({experts // state.ep_size} of "
              f"{experts} experts per rank) x shard={state.hybrid_shard_degree} x "
              f"replicate={state.replicate_degree}; dp_size={state.dp_size}", flush=True)
    torch.manual_seed(0)  # every rank starts from the same weights before experts are split
    model = meshtrain_runtime.transform(MixtralForCausalLM(tiny_config()))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)

    per_rank = args.global_batch // state.dp_size
    history: dict[str, list[float]] = {"train:loss": [], "train:aux_loss": []}
    for step in range(args.steps):
        batch = global_batch(step, args.global_batch, args.seq_len)
        ids = batch[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]
        out = model(input_ids=ids, labels=ids, output_router_logits=True)
        out.loss.backward()  # cross entropy + router_aux_loss_coef x global aux loss
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        # aux_loss is already the global batch's value (the same on every rank)
        values = {"train:loss": meshtrain_runtime.global_mean(out.loss),
                  "train:aux_loss": float(out.aux_loss.detach())}
        for name, value in values.items():
            history[name].append(value)
        log_metrics(step=step, **values)

    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))
    if state.rank == 0:
        out_dir = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out_dir / "losses.json").write_text(json.dumps(history))
        print(f"final loss {history['train:loss'][-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
