"""The loader's global order in one process: the same global batches for every dp size and
worker count, disjoint rows per dp rank, state that resumes on another dp size, at an epoch
boundary, twice, or with another global batch size, and the refusals of changed data.

Each rank's view is computed here with ``dp_rank`` / ``dp_size`` (the global order is a pure
function); tests/runtime/test_data_layouts.py shows the same on real tp / pp / cp layouts,
reading the coordinates from init().
"""

from __future__ import annotations

import itertools
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from data_files import numbered_rows, story_texts, write_jsonl

from meshtrain.errors import ConfigError
from meshtrain_runtime.data import loader

SAMPLES, WIDTH, BATCH, STEPS = 50, 9, 8, 6  # 6 whole batches per epoch, 2 samples left out


@pytest.fixture
def rows_file(tmp_path):
    return numbered_rows(tmp_path / "rows.npy", SAMPLES, WIDTH)


def ids(rows: tuple[torch.Tensor, ...]) -> list[int]:
    """The sample ids of a batch of numbered rows (every token of row i is i)."""
    inputs, targets = rows[0], rows[1]
    assert torch.equal(inputs[:, 0], targets[:, 0])
    return inputs[:, 0].tolist()


def flat(batches: list[list[int]]) -> list[int]:
    return list(itertools.chain.from_iterable(batches))


def global_batches(source, dp_size: int, *, steps: int = STEPS, **options) -> list[list[int]]:
    """Each step's global batch as the dp ranks read it, rank 0's rows first."""
    per_rank = [[ids(rows) for _, rows in zip(range(steps), loader(
        source, global_batch_size=BATCH, dp_rank=r, dp_size=dp_size, **options), strict=False)]
        for r in range(dp_size)]
    for rank_steps in per_rank:  # every rank yields the same number of batches
        assert len(rank_steps) == steps
    return [list(itertools.chain.from_iterable(per_rank[r][k] for r in range(dp_size)))
            for k in range(steps)]


@pytest.mark.parametrize("num_workers", [0, 2])
def test_every_dp_size_and_worker_count_reads_the_same_global_batches(rows_file, num_workers):
    reference = global_batches(rows_file, 1)
    assert [len(set(b)) for b in reference] == [BATCH] * STEPS
    assert len(set(flat(reference))) == STEPS * BATCH  # one epoch: no sample twice
    for dp_size in (1, 2, 4):
        assert global_batches(rows_file, dp_size, num_workers=num_workers) == reference


def test_dp_ranks_take_disjoint_contiguous_slices(rows_file):
    full = loader(rows_file, global_batch_size=BATCH)
    for step in range(STEPS):
        expected = full.sample_ids(step).tolist()
        parts = [ids(loader(rows_file, global_batch_size=BATCH, dp_rank=r, dp_size=4).batch(step))
                 for r in range(4)]
        assert parts == [expected[2 * r:2 * r + 2] for r in range(4)]
        assert not set(parts[0]) & set(parts[1])


def test_the_order_is_a_function_of_seed_epoch_and_data(rows_file, tmp_path):
    def order(source, seed: int) -> list[int]:
        return flat(global_batches(source, 1, steps=2 * STEPS, seed=seed, epochs=2))

    first = order(rows_file, 0)
    assert first == order(rows_file, 0)
    assert first != order(rows_file, 1)
    epoch0, epoch1 = first[:STEPS * BATCH], first[STEPS * BATCH:]
    assert epoch0 != epoch1  # each epoch its own shuffle
    other = numbered_rows(tmp_path / "other.npy", SAMPLES + 1, WIDTH)  # other data, other order
    assert order(other, 0)[:BATCH] != first[:BATCH]
    plain = global_batches(rows_file, 1, shuffle=False)
    assert plain == [list(range(k * BATCH, (k + 1) * BATCH)) for k in range(STEPS)]


def test_len_counts_global_batches_of_the_whole_run(rows_file):
    assert len(loader(rows_file, global_batch_size=BATCH)) == STEPS
    assert len(loader(rows_file, global_batch_size=BATCH, epochs=3)) == 3 * STEPS
    long = loader(rows_file, global_batch_size=BATCH, steps=14)  # steps wins over epochs
    assert len(long) == 14 and len(list(long)) == 14 and long.step == 14
    assert long.epoch == 2 and list(long) == []  # a finished loader yields nothing more


def test_uneven_files_give_every_rank_the_same_number_of_batches(tmp_path):
    folder = tmp_path / "shards"
    write_jsonl(folder / "a.jsonl", story_texts(3, seed=1))
    write_jsonl(folder / "b.jsonl", story_texts(40, seed=2))
    counts = {len(list(loader(folder, global_batch_size=6, seq_len=15, dp_rank=r, dp_size=3)))
              for r in range(3)}
    assert counts == {len(loader(folder, global_batch_size=6, seq_len=15))}


# --- state and resume ---


def read(resumed, steps: int) -> list[list[int]]:
    return [ids(rows) for _, rows in zip(range(steps), resumed, strict=False)]


def test_a_resume_on_another_dp_size_reads_on_exactly(rows_file):
    reference = global_batches(rows_file, 1, steps=2 * STEPS, epochs=2)
    saving = [loader(rows_file, global_batch_size=BATCH, epochs=2, dp_rank=r, dp_size=4)
              for r in range(4)]
    for rank in saving:
        read(rank, 4)
    states = [rank.state_dict() for rank in saving]
    assert all(s == states[0] for s in states)  # global: the same on every rank
    assert (states[0]["batches"], states[0]["epoch"], states[0]["offset"]) == (4, 0, 4 * BATCH)
    resumed = [loader(rows_file, global_batch_size=BATCH, epochs=2, dp_rank=r, dp_size=2)
               for r in range(2)]
    for rank in resumed:
        rank.load_state_dict(states[0])
        assert rank.step == 4 and len(rank) == 2 * STEPS
    after = [read(rank, 8) for rank in resumed]
    assert [after[0][k] + after[1][k] for k in range(8)] == reference[4:]


def test_a_resume_at_the_epoch_boundary_and_a_second_resume(rows_file):
    reference = global_batches(rows_file, 1, steps=2 * STEPS, epochs=2)
    first = loader(rows_file, global_batch_size=BATCH, epochs=2, dp_rank=0, dp_size=1)
    read(first, STEPS)  # exactly one epoch
    at_boundary = first.state_dict()
    assert (at_boundary["batches"], at_boundary["epoch"], at_boundary["offset"]) == (STEPS, 1, 0)
    second = loader(rows_file, global_batch_size=BATCH, epochs=2)
    second.load_state_dict(at_boundary)
    assert read(second, 3) == reference[STEPS:STEPS + 3]
    third = loader(rows_file, global_batch_size=BATCH, epochs=2, dp_rank=1, dp_size=2)
    third.load_state_dict(second.state_dict())  # resumed a second time, on dp 2
    other = loader(rows_file, global_batch_size=BATCH, epochs=2, dp_rank=0, dp_size=2)
    other.load_state_dict(second.state_dict())
    rest = [a + b for a, b in zip(read(other, 9), read(third, 9), strict=True)]
    assert rest == reference[STEPS + 3:]


def test_another_global_batch_size_continues_at_the_next_unread_sample(rows_file):
    order = flat(global_batches(rows_file, 1, shuffle=True))
    saving = loader(rows_file, global_batch_size=BATCH)
    read(saving, 2)
    bigger = loader(rows_file, global_batch_size=12)
    bigger.load_state_dict(saving.state_dict())
    assert bigger.step == 2
    assert read(bigger, 2) == [order[16:28], order[28:40]]  # then the epoch has no whole batch
    assert bigger.epoch == 1 and len(bigger) == 4


def test_a_resume_does_not_replay_consumed_batches(rows_file, monkeypatch):
    saving = loader(rows_file, global_batch_size=BATCH, steps=1000)
    saving.load_state_dict({**saving.state_dict(), "batches": 900, "epoch": 150, "offset": 0})
    fetched = []
    samples = saving.data.samples
    real = samples.sample
    monkeypatch.setattr(samples, "sample", lambda i: fetched.append(i) or real(i))
    assert len(read(saving, 1)) == 1 and len(fetched) == BATCH  # one batch read, not 901


def test_changed_data_seed_or_order_is_refused_by_name(tmp_path):
    folder = tmp_path / "corpus"
    write_jsonl(folder / "a.jsonl", story_texts(30, seed=1))
    write_jsonl(folder / "b.jsonl", story_texts(30, seed=2))
    saved = loader(folder, global_batch_size=4, seq_len=15)
    list(zip(range(2), saved, strict=False))
    state = saved.state_dict()
    write_jsonl(folder / "b.jsonl", story_texts(31, seed=2))
    with pytest.raises(ConfigError, match=r"file 'b\.jsonl' changed \(\d+ -> \d+ bytes\)"):
        loader(folder, global_batch_size=4, seq_len=15).load_state_dict(state)
    write_jsonl(folder / "b.jsonl", story_texts(30, seed=2))
    write_jsonl(folder / "c.jsonl", story_texts(2, seed=3))
    with pytest.raises(ConfigError, match=r"file 'c\.jsonl' is new"):
        loader(folder, global_batch_size=4, seq_len=15).load_state_dict(state)
    (folder / "c.jsonl").unlink()
    with pytest.raises(ConfigError, match=r"seq_len \(saved: 15; now: 31\)"):
        loader(folder, global_batch_size=4, seq_len=31).load_state_dict(state)
    with pytest.raises(ConfigError,
                       match=r"loader\(seed=3\).*used seed=0.*Pass seed=0 to resume\.$"):
        loader(folder, global_batch_size=4, seq_len=15, seed=3).load_state_dict(state)
    same = loader(folder, global_batch_size=4, seq_len=15)
    same.load_state_dict(state)  # the data as it was: accepted
    assert same.step == 2


def test_a_changed_tokenizer_is_refused_by_name(tmp_path):
    from data_files import word_tokenizer

    corpus = write_jsonl(tmp_path / "c.jsonl", story_texts(40))
    saved = loader(corpus, global_batch_size=4, seq_len=7)  # UTF-8 bytes
    state = saved.state_dict()
    with pytest.raises(ConfigError, match=r"the tokenizer \(saved: UTF-8 bytes; now: a Hugging "
                                          r"Face tokenizer of 15 ids"):
        loader(corpus, global_batch_size=4, seq_len=7,
               tokenizer=word_tokenizer()).load_state_dict(state)


def test_bad_arguments_are_config_errors_with_the_fix(rows_file):
    with pytest.raises(ConfigError, match=r"global_batch_size=6 does not split evenly over 4 "
                                          r"data-parallel ranks.*e\.g\. 8\.$"):
        iter(loader(rows_file, global_batch_size=6, dp_rank=0, dp_size=4))
    with pytest.raises(ConfigError, match=r"global_batch_size=64 is more than the 50 samples"):
        loader(rows_file, global_batch_size=64)
    with pytest.raises(ConfigError, match=r"loader\(epochs=0\): epochs is an int >= 1\.$"):
        loader(rows_file, global_batch_size=BATCH, epochs=0)
    with pytest.raises(ConfigError, match="go together"):
        loader(rows_file, global_batch_size=BATCH, dp_rank=1)
    with pytest.raises(ConfigError, match=r"rows have \[9\] tokens but seq_len=4 needs 5"):
        loader(rows_file, global_batch_size=BATCH, seq_len=4)
    with pytest.raises(ConfigError, match=r"load_state_dict\(\) takes what a loader's state_dict"):
        loader(rows_file, global_batch_size=BATCH).load_state_dict({"batches": 3})


def test_a_job_step_before_a_restored_loader_is_refused(rows_file, monkeypatch):
    from meshtrain_runtime import fault

    restored = loader(rows_file, global_batch_size=BATCH)
    restored.load_state_dict({**restored.state_dict(), "batches": 2, "offset": 2 * BATCH})
    # a replica group's process, as far as the loader asks: a job at step 0 (not resumed from
    # the checkpoint the loader was)
    group = SimpleNamespace(current_step=lambda: 0, step_to_run=lambda: 0)
    monkeypatch.setattr(fault, "_session", group)
    with pytest.raises(ConfigError, match=r"the job is at step 0, before the 2 global batches "
                                          r".*loader=loader\)\.$"):
        next(iter(restored))


def test_the_state_is_json_and_names_what_it_holds(rows_file):
    import json

    state = loader(rows_file, global_batch_size=BATCH).state_dict()
    assert json.loads(json.dumps(state)) == state
    assert {"batches", "epoch", "offset", "global_batch_size", "seed", "shuffle",
            "fingerprint"} <= set(state)
    fingerprint = state["fingerprint"]
    assert fingerprint["source"]["files"]["rows.npy"]["bytes"] == rows_file.stat().st_size
    assert (fingerprint["seq_len"], fingerprint["packing"], fingerprint["samples"]) == (
        WIDTH - 1, "rows", SAMPLES)
    assert np.array_equal(loader(rows_file, global_batch_size=BATCH).sample_ids(0),
                          loader(rows_file, global_batch_size=BATCH).sample_ids(0))
