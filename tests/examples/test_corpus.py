"""examples/data: the corpus the examples train on is what make_corpus.py writes, and the loader
reads it as the examples' `train` channel does."""

from __future__ import annotations

import importlib.util
from pathlib import Path

DATA = Path(__file__).resolve().parents[2] / "examples" / "data"


def test_the_corpus_is_the_generators_output():
    spec = importlib.util.spec_from_file_location("make_corpus", DATA / "make_corpus.py")
    make_corpus = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(make_corpus)  # importing it writes nothing
    committed = (DATA / "corpus" / "train.jsonl").read_text(encoding="utf-8")
    assert committed == "\n".join(make_corpus.corpus_lines()) + "\n"
    assert sorted(p.name for p in (DATA / "corpus").iterdir()) == ["train.jsonl"]
    from meshtrain_runtime.data import loader

    quickstart = loader(DATA / "corpus", global_batch_size=16, seq_len=64, steps=20)
    assert quickstart.vocab_size == 257 and quickstart.batches_per_epoch >= 20
