"""Activation checkpointing and offloading from the distribution dict, and what they save.

Runs on every rank under torchrun. ``transform`` checkpoints every decoder layer of a tiny HF
``LlamaForCausalLM`` (only each layer's input is kept in forward, the rest is recomputed in
backward) and offloads those inputs to host memory with a prefetch horizon. Before training,
the script counts the bytes autograd saves for backward in one forward of the same batch through
a plain copy of the model and through the transformed one (``SavedActivationMeter``; per rank).
On a CPU host the offload copies nothing (the tensors already live in host memory), but the
offloader still runs and counts what it would move.
"""

from __future__ import annotations

import argparse
import copy
import json
import os
from pathlib import Path

import torch
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime
from meshtrain_runtime.checkpoint import export_full_state_dict
from meshtrain_runtime.diagnostics.memory import SavedActivationMeter
from meshtrain_runtime.metrics import log_metric
from meshtrain_runtime.parallel.activations import checkpointed_blocks, get_offload_stats

VOCAB = 128


def tiny_config() -> LlamaConfig:
    return LlamaConfig(vocab_size=VOCAB, hidden_size=64, intermediate_size=172,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=256, use_cache=False)


def global_batch(step: int, rows: int, seq_len: int) -> torch.Tensor:
    generator = torch.Generator().manual_seed(step)
    start = torch.randint(0, VOCAB, (rows, 1), generator=generator)
    return (start + torch.arange(seq_len)) % VOCAB


def saved_bytes(model: torch.nn.Module, ids: torch.Tensor) -> tuple[int, float]:
    """Bytes saved for backward by one forward, and its loss (the graph is then freed)."""
    with SavedActivationMeter(model.parameters()) as meter:
        loss = model(input_ids=ids, labels=ids).loss
    return meter.result.bytes, float(loss.detach())


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=4)
    parser.add_argument("--seq-len", type=int, default=128)
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters

    state = meshtrain_runtime.init()
    torch.manual_seed(0)
    plain = LlamaForCausalLM(tiny_config())
    model = meshtrain_runtime.transform(copy.deepcopy(plain))
    per_rank = args.global_batch // state.dp_size

    def rows(step: int) -> torch.Tensor:
        batch = global_batch(step, args.global_batch, args.seq_len)
        return batch[state.dp_rank * per_rank:(state.dp_rank + 1) * per_rank]

    plain_bytes, plain_loss = saved_bytes(plain, rows(0))
    ckpt_bytes, ckpt_loss = saved_bytes(model, rows(0))
    del plain
    report = {"checkpointed_blocks": len(checkpointed_blocks(model)),
              "saved_bytes_plain": plain_bytes, "saved_bytes_checkpointed": ckpt_bytes,
              "first_loss_plain": plain_loss, "first_loss_checkpointed": ckpt_loss}
    if state.rank == 0:
        print(f"saved activations per rank, one forward: plain {plain_bytes:,} bytes, "
              f"checkpointed {ckpt_bytes:,} bytes ({plain_bytes / ckpt_bytes:.1f}x less; "
              f"{report['checkpointed_blocks']} blocks checkpointed)", flush=True)

    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    stats = get_offload_stats(model)
    if stats is not None:
        stats.reset()  # count the training steps only
    losses = []
    for step in range(args.steps):
        loss = model(input_ids=rows(step), labels=rows(step)).loss
        loss.backward()
        meshtrain_runtime.clip_grad_norm_(model, 1.0)
        optimizer.step()
        optimizer.zero_grad()
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        log_metric("train:loss", losses[-1], step=step)

    if stats is not None:
        report.update(blocks_offloaded=stats.blocks_offloaded,
                      bytes_offloaded=stats.bytes_offloaded, loads=stats.loads,
                      prefetched_loads=stats.prefetched_loads,
                      max_resident_blocks=stats.max_resident_blocks)
    export_full_state_dict(model, os.environ.get("SM_MODEL_DIR", "model"))
    if state.rank == 0:
        print(f"offloader: {json.dumps({k: v for k, v in report.items() if 'load' in k})}",
              flush=True)
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        (out / "activations.json").write_text(json.dumps(report))
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
