"""A plain hybrid-sharded script fed by ``meshtrain_runtime.data.loader``, run as an Estimator job
with ``fault_tolerance: {"replica_groups": 2}`` by tests/e2e/test_data_fault_tolerance.py (a
rank SIGKILLed) and tests/e2e/test_fault_tolerance_long.py (every rank SIGKILLed after a
checkpoint). Its loop is ``for inputs, targets in loader:`` and nothing in it knows about fault
tolerance: the loader hands out the rows of the job's step (a restarted group heals and starts
at the job's step; a step that did not commit is read again) and ends every group's loop at the
run's last step. With --checkpoint-every K it saves model, optimizer and loader after every K-th
batch and starts from the latest checkpoint when the job has one, as any resumable script does.

For the tests' checks each rank writes, into its host's output data dir,
``ft-rows-dp<dp_rank>.jsonl`` (one line per batch it was handed: the loader's step, the samples,
its loss, the time and the host's attempt) and, when its loop ended, ``ft-end-dp<dp_rank>.json``
(the loader's step then, and a sha256 of its local parameter shards and optimizer state). Each
step waits --delay seconds (its data loading); --num-workers DataLoader workers prepare the
batches ahead.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch
from ft_hsdp_train import digest  # the same digest as the plain script's (scripts/ is the job's)
from loader_train import NextByte, loss_fn  # the same model as the restart-and-reshard job's

import meshtrain_runtime as mr

INIT_SEED, LR, WIDTH = 0, 0.01, 16


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=40)
    parser.add_argument("--global-batch-size", type=int, default=8)
    parser.add_argument("--seq-len", type=int, default=16)
    parser.add_argument("--delay", type=float, default=0.05)
    parser.add_argument("--num-workers", type=int, default=0)
    parser.add_argument("--checkpoint-every", type=int, default=0)
    args, _ = parser.parse_known_args()
    state = mr.init()
    loader = mr.data.loader("train", global_batch_size=args.global_batch_size,
                            seq_len=args.seq_len, steps=args.steps, num_workers=args.num_workers)
    torch.manual_seed(INIT_SEED)
    model = mr.transform(NextByte(loader.vocab_size, WIDTH))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    if args.checkpoint_every and mr.latest_checkpoint() is not None:
        mr.load_checkpoint(None, model, optimizer, loader=loader)
    out = Path(os.environ["SM_OUTPUT_DATA_DIR"])
    rows = (out / f"ft-rows-dp{state.dp_rank}.jsonl").open("a")
    attempt = os.environ.get("MESHTRAIN_ATTEMPT")
    for inputs, targets in loader:
        loss = mr.forward_backward(model, inputs, targets, loss_fn=loss_fn)
        optimizer.step()
        optimizer.zero_grad()
        if args.checkpoint_every and loader.step % args.checkpoint_every == 0:
            mr.save_checkpoint(None, model, optimizer, step=loader.step, loader=loader)
        samples = torch.cat([inputs, targets[:, -1:]], dim=1).tolist()
        rows.write(json.dumps({"step": loader.step - 1, "samples": samples, "loss": float(loss),
                               "time": time.time(), "attempt": attempt}) + "\n")
        rows.flush()
        time.sleep(args.delay)
    (out / f"ft-end-dp{state.dp_rank}.json").write_text(json.dumps(
        {"end": loader.step, "digest": digest(model, optimizer)}))


if __name__ == "__main__":
    main()
