"""The loader's position in a checkpoint: ``save_checkpoint(..., loader=)`` stores it, and
``load_checkpoint(..., loader=)`` continues from it, or refuses changed data before reading a
tensor (one process; test_data_layouts.py does it across real layouts)."""

from __future__ import annotations

import json

import pytest
import torch
from data_files import story_texts, write_jsonl
from torch import nn

from meshtrain.errors import ConfigError
from meshtrain_runtime.checkpoint import MARKER_NAME, load_checkpoint, save_checkpoint
from meshtrain_runtime.data import loader

GLOBAL_BATCH, SEQ_LEN = 4, 15


def _model(seed: int) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(257, 8), nn.Flatten(), nn.Linear(8 * SEQ_LEN, 1))


def _corpus(tmp_path):
    return write_jsonl(tmp_path / "data" / "train.jsonl", story_texts(60))


def test_the_checkpoint_keeps_the_loader_and_the_resume_reads_the_next_batch(tmp_path):
    corpus = _corpus(tmp_path)
    uninterrupted = [x for x, _ in loader(corpus, global_batch_size=GLOBAL_BATCH,
                                          seq_len=SEQ_LEN)]
    reading = loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN)
    for _ in zip(range(3), reading, strict=False):
        pass
    saved = save_checkpoint(tmp_path / "ckpt", _model(0), step=3, loader=reading)
    marker = json.loads((saved / MARKER_NAME).read_text())
    assert marker["loader"] == reading.state_dict() and marker["loader"]["batches"] == 3
    resumed = loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN)
    model = _model(1)
    info = load_checkpoint(tmp_path / "ckpt", model, loader=resumed)
    assert info["step"] == 3 and resumed.step == 3
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), _model(0).parameters(),
                                                   strict=True))
    rest = [x for x, _ in resumed]
    assert len(rest) == len(uninterrupted) - 3
    assert all(torch.equal(a, b) for a, b in zip(rest, uninterrupted[3:], strict=True))


def test_a_changed_file_is_refused_before_any_tensor_is_read(tmp_path):
    corpus = _corpus(tmp_path)
    reading = loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN)
    save_checkpoint(tmp_path / "ckpt", _model(0), step=0, loader=reading)
    write_jsonl(corpus, story_texts(61))
    model = _model(1)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(ConfigError, match=r"the data changed since the checkpoint was saved: "
                                          r"file 'train\.jsonl' changed"):
        load_checkpoint(tmp_path / "ckpt", model,
                        loader=loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN))
    assert all(torch.equal(a, b) for a, b in zip(model.parameters(), before, strict=True))


def test_a_checkpoint_without_a_loader_says_so(tmp_path):
    corpus = _corpus(tmp_path)
    save_checkpoint(tmp_path / "ckpt", _model(0), step=0)
    with pytest.raises(ConfigError, match=r"was saved without a loader.*save_checkpoint\(\.\.\., "
                                          r"loader=loader\)"):
        load_checkpoint(tmp_path / "ckpt", _model(0),
                        loader=loader(corpus, global_batch_size=GLOBAL_BATCH, seq_len=SEQ_LEN))
