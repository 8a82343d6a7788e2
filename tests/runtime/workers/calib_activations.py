"""Per-rank saved-activation bytes of a tiny HF Llama, for the planner's calibration.

Layouts on 2 ranks: tp 1 (FSDP2 full shard over both ranks), tp 2 (tensor parallelism alone),
tp 2 with sequence parallelism and tp 2 with loss parallelism (vocab-split logits), each at two
sequence lengths, without activation checkpointing, with it ("full") and with op-level
selective checkpointing ("selective") of every block. One forward (loss
included) runs under the runtime's ``SavedActivationMeter`` (given the model's
parameters, so TP's views of replicated weights are not counted): distinct storages
autograd saves for backward, parameters left out, DTensors by their local shard. Forward
and backward also run under the runtime's collective counter.
"""

from __future__ import annotations

import contextlib
from typing import Any

import torch
import torch.distributed as dist
from calib_support import (
    build_model,
    collectives_of,
    config_record,
    llama_config,
    smaller_phase_peaks,
)
from report import report
from torch.distributed.tensor.parallel import loss_parallel

import meshtrain_runtime as mr
from meshtrain_runtime.diagnostics.memory import SavedActivationMeter

MICRO_BATCH = 2
SEQ_LENS = (32, 96)
LAYOUTS: dict[str, dict[str, Any]] = {
    "tp1": {},
    "tp2": {"tensor_parallel_degree": 2},
    "tp2_sp": {"tensor_parallel_degree": 2, "sequence_parallel": True},
    "tp2_lp": {"tensor_parallel_degree": 2, "loss_parallel": True},
}


def measure(layout: str, params: dict[str, Any], seq_len: int, checkpointing: bool | str) -> None:
    params = {**params, "activation_checkpointing": checkpointing}
    mr.init(params)
    config = llama_config()
    lp = params.get("loss_parallel", False)
    model = mr.transform(build_model(config))
    generator = torch.Generator().manual_seed(200 + mr.state.dp_rank)
    ids = torch.randint(0, config.vocab_size, (MICRO_BATCH, seq_len), generator=generator)
    meter = SavedActivationMeter(parameters=model.parameters())
    losses = []

    def step() -> None:
        # loss_parallel: the logits stay vocab-split DTensors; torch's context computes the
        # cross entropy on them (forward and backward)
        with loss_parallel() if lp else contextlib.nullcontext():
            with meter:
                losses.append(model(input_ids=ids, labels=ids).loss)
            losses[0].backward()

    collectives = collectives_of(step)
    loss = losses[0]
    # A second forward and backward phase by phase (no optimizer: parameters are the baseline).
    del losses[:]
    phases = {} if lp else smaller_phase_peaks(model, ids)
    report({
        "case": "activations",
        "layout": layout,
        "params": params,
        "world_size": dist.get_world_size(),
        "seq_len": seq_len,
        "micro_batch": MICRO_BATCH,
        "checkpointing": checkpointing,
        "config": config_record(config),
        "saved_bytes": meter.result.bytes,
        "saved_tensors": meter.result.num_tensors,
        "loss": float(loss.full_tensor() if lp else loss.detach()),
        "collectives": collectives,
        "phases": phases,
    })
    mr.reset()


def run_activation_cases() -> None:
    """Every layout x sequence length x checkpointing off / full / selective (2 ranks)."""
    for layout, params in LAYOUTS.items():
        for seq_len in SEQ_LENS:
            for checkpointing in (False, True, "selective"):
                measure(layout, params, seq_len, checkpointing)
