"""A local job's entry point (2 hosts x 2 processes): pp2 x dp2 training of the GPT-2-style
plain module of pipeline_parity.py (FSDP2 per stage); rank 0 writes the per-step global mean
losses to the model directory. tests/runtime/test_pipeline_estimator.py compares them with one
process and reads the job's log."""

from __future__ import annotations

import json
import os
import warnings
from pathlib import Path

import torch
import torch.distributed as dist
from pipeline_parity import CLIP, GLOBAL_BATCH, LR, STEPS, build, data, loss_fn

import meshtrain_runtime as mr


def main() -> None:
    mr.init()  # the parameters come from the Estimator's distribution
    st = mr.state
    if st.rank == 0:  # the test checks that warnings reach the job's log
        warnings.warn("pipeline_job: a warning of the training script", UserWarning, stacklevel=1)
    model = mr.transform(build("gpt"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens, losses = data(), []
    for step in range(STEPS):
        rows = tokens[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH].chunk(st.dp_size)[st.dp_rank]
        loss = mr.forward_backward(model, rows[:, :-1], rows[:, 1:], loss_fn=loss_fn)
        mr.clip_grad_norm_(model, CLIP)  # as the reference does
        optimizer.step()
        optimizer.zero_grad()
        total = loss.clone()
        dist.all_reduce(total)
        losses.append(float(total) / st.world_size)
    if st.rank == 0:
        record = {"losses": losses, "pp_size": st.pp_size, "dp_size": st.dp_size,
                  "microbatches": st.config.microbatches, "fsdp": st.dp_size > 1,
                  "hosts": json.loads(os.environ["SM_HOSTS"])}
        (Path(os.environ["SM_MODEL_DIR"]) / "losses.json").write_text(json.dumps(record))


if __name__ == "__main__":
    main()
