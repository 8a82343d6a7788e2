"""Llama split into 2 pipeline stages, each stage hybrid-sharded over 2 ranks (pp2 x dp2).

Runs on every rank under torchrun. ``meshtrain_runtime.transform`` keeps this rank's stage of
Hugging Face's ``LlamaForCausalLM`` (built from a tiny config, nothing downloaded) and shards it
with FSDP2; ``forward_backward`` runs torch's 1F1B schedule over ``microbatches`` chunks of this
data-parallel rank's rows (``meshtrain_runtime.data.loader("train", ...)``: the ``train``
channel's text as UTF-8 bytes) and returns the mean loss on every rank of the pipeline. At the
end every rank saves its shards and the loader's position with ``save_checkpoint`` into
``$SM_CHECKPOINT_DIR``.

With ``--timeline-step N`` (N >= 1) every rank also records when each of its forward (F) and
backward (B) actions of step N started and ended (seconds on the wall clock, from the
earliest rank's start: one clock for every rank of a local job, NTP-close across real hosts),
and writes them to ``$SM_OUTPUT_DATA_DIR/timeline-rank<r>.json`` (packed into output.tar.gz).
"""

from __future__ import annotations

import argparse
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime
from meshtrain_runtime import metrics


def tiny_config(vocab_size: int) -> LlamaConfig:
    """Llama at toy size: 4 blocks (2 per stage); the embeddings are untied because the input
    embedding lives on the first stage and the head on the last."""
    return LlamaConfig(vocab_size=vocab_size, hidden_size=64, intermediate_size=128,
                       num_hidden_layers=4, num_attention_heads=4, num_key_value_heads=2,
                       max_position_embeddings=64, tie_word_embeddings=False, use_cache=False)


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean next-token cross-entropy of one microbatch (what forward_backward averages)."""
    return torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())


class Timeline:
    """Start and end of every forward / backward action of this rank's stages in one step."""

    def __init__(self) -> None:
        self.actions: list[dict[str, Any]] = []
        self.origin = 0.0

    def wrap(self, stage: Any) -> None:
        """Time `stage`'s (a torch PipelineStage) per-microbatch forward and backward calls."""
        stage.forward_one_chunk = self._timed("F", stage.stage_index, stage.forward_one_chunk)
        stage.backward_one_chunk = self._timed("B", stage.stage_index, stage.backward_one_chunk)

    def _timed(self, kind: str, stage_index: int, call: Callable[..., Any]) -> Callable[..., Any]:
        def timed(chunk: int, *args: Any, **kwargs: Any) -> Any:
            start = time.time() - self.origin
            result = call(chunk, *args, **kwargs)
            self.actions.append({"kind": kind, "stage": stage_index, "microbatch": chunk,
                                 "start": start, "end": time.time() - self.origin})
            return result
        return timed

    def start(self) -> None:
        """Set the origin to the earliest rank's time after a barrier: one origin for all (a
        per-rank origin would shift each row by its own barrier exit)."""
        dist.barrier()
        now = torch.tensor([time.time()], dtype=torch.float64)
        dist.all_reduce(now, op=dist.ReduceOp.MIN)
        self.origin = float(now)


def write_timeline(timeline: Timeline, step: int, seconds: float) -> None:
    st = meshtrain_runtime.state
    record = {"rank": st.rank, "pp_rank": st.pp_rank, "dp_rank": st.dp_rank, "step": step,
              "seconds": seconds, "actions": timeline.actions}
    out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
    (out / f"timeline-rank{st.rank}.json").write_text(json.dumps(record))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=8)
    parser.add_argument("--lr", type=float, default=1e-2)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=32)
    parser.add_argument("--timeline-step", type=int, default=-1, help="record this step (>= 1)")
    args, _ = parser.parse_known_args()  # SMP jobs also receive --mp_parameters
    if args.timeline_step == 0:
        parser.error("--timeline-step must be >= 1: step 0 builds the pipeline's stages")

    state = meshtrain_runtime.init()
    if state.rank == 0:
        print(f"layout: pp={state.pp_size} x dp={state.dp_size} "
              f"({state.sharding_strategy} within each stage)", flush=True)
    loader = meshtrain_runtime.data.loader("train", global_batch_size=args.global_batch,
                                           seq_len=args.seq_len, steps=args.steps)
    torch.manual_seed(0)  # every rank builds the same weights, then keeps its stage
    model = meshtrain_runtime.transform(LlamaForCausalLM(tiny_config(loader.vocab_size)))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    timeline = Timeline()

    losses = []
    for step, (inputs, targets) in enumerate(loader):  # every stage of a pipeline: the same rows
        if step == args.timeline_step:
            for stage in model.runner.stages:  # built by forward_backward at step 0
                timeline.wrap(stage)
            timeline.start()
        loss = meshtrain_runtime.forward_backward(model, inputs, targets, loss_fn=loss_fn)
        meshtrain_runtime.clip_grad_norm_(model, 1.0)  # the norm of the whole model
        optimizer.step()
        optimizer.zero_grad()
        if step == args.timeline_step:
            write_timeline(timeline, step, time.time() - timeline.origin)
        losses.append(meshtrain_runtime.global_mean(loss))  # the global batch's loss
        metrics.log(step=step, loss=losses[-1])

    path = meshtrain_runtime.save_checkpoint(None, model, optimizer, step=args.steps,
                                             loader=loader)
    if state.rank == 0:
        out = Path(os.environ.get("SM_OUTPUT_DATA_DIR", "."))
        (out / "losses.json").write_text(json.dumps({"train:loss": losses}))
        print(f"checkpoint: {path}", flush=True)
        print(f"final loss {losses[-1]:.4f}", flush=True)


if __name__ == "__main__":
    main()
