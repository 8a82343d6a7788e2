"""Issue 40 on real layouts: the loader reads its coordinates from init(), every layout reads the
same global batches, and a checkpoint saved with the loader resumes exactly on another one.

Two launches (tests/runtime/workers/data_layouts.py): 4 ranks (dp4, tp2 x dp2, pp2 x dp2,
cp2 x dp2 (its rows; examples/llama_context trains on the loader with cp), dp4 resuming
tp2 x dp2's checkpoint, DataLoader workers), then 2 ranks (dp2 resuming
dp4's checkpoint, then its own at the epoch boundary: a job resumed twice; dp2 resuming
pp2 x dp2's; workers). The reference is this process: the same loader read by one rank
(dp 1) and the same tiny Llama trained on it, whose losses every layout matches within 1e-5.
The corpus holds 6 global batches and a few samples per epoch, so step 6 starts the second
epoch.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
from ci_guards import import_or_skip
from conftest import WORKERS
from data_files import story_texts, write_jsonl

from meshtrain_runtime.data import loader

import_or_skip("transformers")
pytestmark = pytest.mark.multiprocess
WORKER = WORKERS / "data_layouts.py"
GLOBAL_BATCH, SEQ_LEN, STEPS = 8, 16, 8
TOLERANCE = 1e-5


def _corpus(directory: Path) -> Path:
    """A corpus of 6 whole global batches (and a few samples over) per epoch."""
    for count in range(1, 200):
        path = write_jsonl(directory / "corpus" / "train.jsonl", story_texts(count, seed=4))
        made = loader(path.parent, global_batch_size=1, seq_len=SEQ_LEN)
        if 6 * GLOBAL_BATCH < made.num_samples < 7 * GLOBAL_BATCH:
            return path.parent
    raise AssertionError("no corpus size gives 6 batches per epoch")


@pytest.fixture(scope="module")
def run(tmp_path_factory, torchrun) -> dict[str, Any]:
    root = tmp_path_factory.mktemp("data_layouts")
    corpus = _corpus(root)
    records = torchrun(WORKER, 4, "four", str(root), str(corpus), timeout=900)
    records += torchrun(WORKER, 2, "two", str(root), str(corpus), timeout=600)
    cases: dict[str, list[dict[str, Any]]] = {}
    for record in records:
        cases.setdefault(record["case"], []).append(record)
    return {"cases": cases, "corpus": corpus, "reference": _one_process(corpus)}


def _one_process(corpus: Path) -> dict[str, Any]:
    """The global batches and losses of one process reading the same loader."""
    import importlib.util

    import torch

    spec = importlib.util.spec_from_file_location("data_model", WORKERS / "data_model.py")
    model_code = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(model_code)
    data = loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN, steps=STEPS)
    model = model_code.build()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    batches, losses = [], []
    for inputs, targets in data:
        loss = model_code.loss_fn(model(inputs).logits, targets)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        batches.append(model_code.samples(inputs, targets))
        losses.append(loss.item())
    ids = [data.sample_ids(step).tolist() for step in range(STEPS)]
    return {"batches": batches, "losses": losses, "ids": ids}


def _global_batches(records: list[dict[str, Any]]) -> dict[int, list[list[int]]]:
    """step -> the global batch, dp rank 0's rows first; peers of a dp rank must agree."""
    by_step: dict[int, dict[int, list[list[int]]]] = {}
    for record in records:
        for entry in record["steps"]:
            rows = by_step.setdefault(entry["step"], {})
            seen = rows.setdefault(record["dp_rank"], entry["samples"])
            assert seen == entry["samples"], (record["case"], entry["step"], record["rank"])
    (dp_size,) = {r["dp_size"] for r in records}
    for step, rows in by_step.items():
        assert sorted(rows) == list(range(dp_size)), (step, sorted(rows))
    return {step: list(itertools.chain.from_iterable(rows[r] for r in range(dp_size)))
            for step, rows in by_step.items()}


def _losses(records: list[dict[str, Any]]) -> dict[int, float]:
    values: dict[int, float] = {}
    for record in records:
        for entry in record.get("steps", []):
            if "loss" in entry:
                assert values.setdefault(entry["step"], entry["loss"]) == pytest.approx(
                    entry["loss"], abs=1e-7)
    return values


ROWS_ONLY = {"dp4_workers2", "dp2_workers0", "dp2_workers2", "cp2xdp2"}  # no model trained
LAYOUTS = {  # case -> (dp_size, the steps it ran, ranks per dp rank)
    "dp4": (4, range(0, 8), 1), "dp4_workers2": (4, range(0, 6), 1),
    "tp2xdp2": (2, range(0, 6), 2), "pp2xdp2": (2, range(0, 6), 2),
    "cp2xdp2": (2, range(0, 6), 2), "dp2_workers0": (2, range(0, 6), 1),
    "dp2_workers2": (2, range(0, 6), 1),
    "dp2_to_dp4": (4, range(4, 8), 1), "dp4_to_dp2": (2, range(4, 8), 1),
    "resumed_twice": (2, range(6, 8), 1), "pp2xdp2_to_dp2": (2, range(4, 8), 1),
}


@pytest.mark.parametrize("case", sorted(LAYOUTS))
def test_every_layout_reads_the_global_batches_of_one_process(run, case):
    dp_size, steps, peers = LAYOUTS[case]
    records = run["cases"][case]
    assert {r["dp_size"] for r in records} == {dp_size}
    assert sorted(r["dp_rank"] for r in records) == sorted(list(range(dp_size)) * peers)
    batches = _global_batches(records)
    assert sorted(batches) == list(steps)
    for step, batch in batches.items():
        assert batch == run["reference"]["batches"][step], (case, step)
    for record in records:  # dp ranks' rows are disjoint slices of the global batch
        for entry in record["steps"]:
            per_rank = GLOBAL_BATCH // dp_size
            ids = run["reference"]["ids"][entry["step"]]
            assert len(entry["samples"]) == per_rank
            mine = ids[record["dp_rank"] * per_rank:(record["dp_rank"] + 1) * per_rank]
            assert len(set(mine)) == per_rank


@pytest.mark.parametrize("case", sorted(c for c in LAYOUTS if c not in ROWS_ONLY))
def test_every_layout_and_resume_trains_with_one_process_losses(run, case):
    losses = _losses(run["cases"][case])
    reference = run["reference"]["losses"]
    assert sorted(losses) == list(LAYOUTS[case][1])
    worst = max(abs(losses[s] - reference[s]) for s in losses)
    assert worst <= TOLERANCE, (case, losses, reference)


def test_resumed_runs_read_every_sample_once_per_epoch(run):
    ids = run["reference"]["ids"]
    first_epoch = list(itertools.chain.from_iterable(ids[:6]))
    assert len(set(first_epoch)) == len(first_epoch) == 6 * GLOBAL_BATCH
    assert len(set(itertools.chain.from_iterable(ids[6:]))) == 2 * GLOBAL_BATCH
    # dp4 for steps 0-3, dp2 for 4-5, dp2 again (resumed twice) for 6-7: every step once
    pieces = [_global_batches(run["cases"]["dp4"]), _global_batches(run["cases"]["dp4_to_dp2"]),
              _global_batches(run["cases"]["resumed_twice"])]
    read = {**{s: b for s, b in pieces[0].items() if s < 4},
            **{s: b for s, b in pieces[1].items() if s < 6}, **pieces[2]}
    assert sorted(read) == list(range(STEPS))
    assert [read[s] for s in range(STEPS)] == run["reference"]["batches"]
