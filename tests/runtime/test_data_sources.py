"""What the loader reads: every source kind and format, tokenization, packing, position ids and
SageMaker channels (File / FastFile read, Pipe refused), in one process."""

from __future__ import annotations

import json
import os
import re
import sys

import numpy as np
import pytest
import torch
from ci_guards import import_or_skip
from data_files import numbered_rows, word_tokenizer, write_jsonl, write_megatron

from meshtrain.errors import ConfigError
from meshtrain_runtime.data import loader
from meshtrain_runtime.data.formats import import_datasets
from meshtrain_runtime.data.tokenize import BYTE_EOS

TEXTS = ["ab", "cde", "fghij"]  # bytes 97.. ; EOS 256 after each document


def stream(source, seq_len: int = 3, **options) -> list[list[int]]:
    """Every sample's tokens, in order (no shuffle), as one rank of one reads them."""
    ordered = loader(source, global_batch_size=1, seq_len=seq_len, shuffle=False, **options)
    return [torch.cat([x[0, :1], y[0]]).tolist() for x, y in ordered]


def test_text_is_packed_as_utf8_bytes_with_eos_between_documents(tmp_path):
    corpus = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    tokens = [97, 98, BYTE_EOS, 99, 100, 101, BYTE_EOS, 102, 103, 104, 105, 106, BYTE_EOS]
    assert stream(corpus) == [tokens[0:4], tokens[4:8], tokens[8:12]]  # the tail is dropped
    inputs, targets = loader(corpus, global_batch_size=1, seq_len=3, shuffle=False).batch(1)
    assert inputs.tolist() == [tokens[4:7]] and targets.tolist() == [tokens[5:8]]
    assert inputs.dtype == targets.dtype == torch.int64
    made = loader(corpus, global_batch_size=1, seq_len=3)
    assert (made.vocab_size, made.eos_token_id, made.seq_len, made.num_samples) == (257, 256, 3, 3)


def test_position_ids_restart_at_every_document(tmp_path):
    corpus = write_jsonl(tmp_path / "t.jsonl", TEXTS)
    rows = loader(corpus, global_batch_size=1, seq_len=3, shuffle=False, position_ids=True)
    positions = [p[0].tolist() for _, _, p in rows]
    # tokens a b EOS | c d e EOS | f g h i j EOS: positions 0 1 2 | 0 1 2 3 | 0 1 2 3 4 5
    assert positions == [[0, 1, 2], [1, 2, 3], [1, 2, 3]]
    npy = numbered_rows(tmp_path / "rows.npy", 4, 5)  # samples as they are: from each row's start
    first = next(iter(loader(npy, global_batch_size=1, position_ids=True)))
    assert first[2].tolist() == [[0, 1, 2, 3]]


def test_json_txt_and_jsonl_read_the_same_text(tmp_path):
    (tmp_path / "array").mkdir()
    (tmp_path / "array" / "t.json").write_text(json.dumps([{"body": t} for t in TEXTS]))
    (tmp_path / "lines").mkdir()
    (tmp_path / "lines" / "t.json").write_text("\n".join(json.dumps({"body": t}) for t in TEXTS))
    (tmp_path / "txt").mkdir()
    for index, text in enumerate(TEXTS):
        (tmp_path / "txt" / f"{index}.txt").write_text(text)
    expected = stream(write_jsonl(tmp_path / "t.jsonl", TEXTS, field="body"), text_field="body")
    assert stream(tmp_path / "array", text_field="body") == expected
    assert stream(tmp_path / "lines", text_field="body") == expected
    assert stream(tmp_path / "txt") == expected
    with pytest.raises(ConfigError, match=r"t\.jsonl line 1 has no field 'text' \(it has "
                                          r"\['body'\]\)\. Pass loader\(\.\.\., text_field="):
        stream(tmp_path / "t.jsonl")


def test_parquet_arrow_and_an_hf_dataset_read_the_same_text(tmp_path):
    datasets = import_or_skip("datasets")  # the `data` extra
    table = datasets.Dataset.from_dict({"text": TEXTS, "id": [0, 1, 2]})
    table.to_parquet(str(tmp_path / "t.parquet"))
    table.save_to_disk(str(tmp_path / "saved"))
    expected = stream(write_jsonl(tmp_path / "j" / "t.jsonl", TEXTS))
    assert stream(tmp_path / "t.parquet") == expected
    assert stream(tmp_path / "saved") == expected  # save_to_disk's .arrow file (json skipped)
    assert stream(table) == expected
    tokens = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3, 4], [5, 6, 7, 8]]})
    assert stream(tokens) == [[1, 2, 3, 4], [5, 6, 7, 8]]  # seq_len + 1 tokens: rows as they are


def test_parquet_without_the_data_extra_names_it(tmp_path, monkeypatch):
    (tmp_path / "t.parquet").write_bytes(b"PAR1")
    monkeypatch.setitem(__import__("sys").modules, "datasets", None)  # import datasets fails
    with pytest.raises(ConfigError, match=r"\.parquet files are read through Hugging Face "
                                          r"datasets.*pip install 'meshtrain\[data\]'\.$"):
        loader(tmp_path / "t.parquet", global_batch_size=1, seq_len=3)


def test_an_hf_tokenizer_object_or_directory(tmp_path):
    import_or_skip("transformers")
    tokenizer = word_tokenizer()
    corpus = write_jsonl(tmp_path / "t.jsonl", ["the cat sat", "a dog ran ."])
    ids = [2, 3, 4, 1, 6, 8, 9, 14, 1]  # the cat sat </s> a dog ran . </s>
    assert stream(corpus, seq_len=3, tokenizer=tokenizer) == [ids[0:4], ids[4:8]]
    tokenizer.save_pretrained(str(tmp_path / "tok"))
    from_dir = loader(corpus, global_batch_size=1, seq_len=3, tokenizer=tmp_path / "tok")
    from_object = loader(corpus, global_batch_size=1, seq_len=3, tokenizer=tokenizer)
    assert from_dir.state_dict() == from_object.state_dict()  # the same tokenizer either way
    assert (from_dir.vocab_size, from_dir.eos_token_id) == (15, 1)
    with pytest.raises(ConfigError, match="no such directory"):
        loader(corpus, global_batch_size=1, seq_len=3, tokenizer=tmp_path / "missing")


def test_npy_rows_are_samples_as_they_are_and_a_stream_is_cut(tmp_path):
    rows = numbered_rows(tmp_path / "rows.npy", 3, 4)
    assert stream(rows, seq_len=3) == [[0] * 4, [1] * 4, [2] * 4]
    assert loader(rows, global_batch_size=1).seq_len == 3  # from the rows' length
    np.save(tmp_path / "flat.npy", np.arange(10, dtype=np.int64))
    assert stream(tmp_path / "flat.npy", seq_len=2) == [[0, 1, 2], [3, 4, 5], [6, 7, 8]]
    with pytest.raises(ConfigError, match=r"loader\(\.\.\., seq_len=N\) is required"):
        loader(tmp_path / "flat.npy", global_batch_size=1)
    (tmp_path / "streams").mkdir()  # two streams laid end to end; their documents unknown
    np.save(tmp_path / "streams" / "a.npy", np.arange(10, dtype=np.int64))
    np.save(tmp_path / "streams" / "b.npy", np.arange(100, 105, dtype=np.int64))
    assert stream(tmp_path / "streams", seq_len=2)[3:] == [[9, 100, 101], [102, 103, 104]]
    windows = loader(tmp_path / "streams", global_batch_size=1, seq_len=2, shuffle=False,
                     position_ids=True)
    assert {tuple(p[0].tolist()) for _, _, p in windows} == {(0, 1)}
    np.save(tmp_path / "floats.npy", np.zeros((2, 3)))
    with pytest.raises(ConfigError, match="integer array"):
        loader(tmp_path / "floats.npy", global_batch_size=1)


def test_megatron_indexed_dataset(tmp_path):
    bin_path = write_megatron(tmp_path / "mega" / "corpus_text_document",
                              [[1, 2, 3], [4, 5], [6, 7, 8, 9, 10]])
    assert stream(tmp_path / "mega", seq_len=2) == [[1, 2, 3], [4, 5, 6], [7, 8, 9]]
    rows = loader(bin_path, global_batch_size=1, seq_len=2, shuffle=False, position_ids=True)
    assert [p[0].tolist() for _, _, p in rows] == [[0, 1], [0, 1], [1, 2]]
    write_megatron(tmp_path / "u16" / "c", [[7, 8, 9, 10]], dtype=np.dtype(np.uint16))
    assert stream(tmp_path / "u16", seq_len=1) == [[7, 8], [9, 10]]
    (tmp_path / "mega" / "corpus_text_document.idx").unlink()
    with pytest.raises(ConfigError, match=r"no corpus_text_document\.idx beside it"):
        loader(bin_path, global_batch_size=1, seq_len=2)


def test_map_style_datasets_of_token_sequences(tmp_path):
    fixed = [torch.full((5,), i) for i in range(6)]  # seq_len + 1 tokens each: samples
    assert stream(fixed, seq_len=4)[:2] == [[0] * 5, [1] * 5]
    tensors = torch.utils.data.TensorDataset(torch.stack(fixed))  # items are (tensor,)
    assert stream(tensors, seq_len=4) == stream(fixed, seq_len=4)

    class Documents(torch.utils.data.Dataset):
        def __len__(self) -> int:
            return 3

        def __getitem__(self, index: int) -> dict:
            return {"input_ids": torch.arange(10 * index, 10 * index + 2 + index)}

    # documents of 2, 3 and 4 tokens, packed as they are (no EOS added): 0 1 10 11 12 20 ...
    assert stream(Documents(), seq_len=2) == [[0, 1, 10], [11, 12, 20], [21, 22, 23]]
    with pytest.raises(ConfigError, match="not a 1-D sequence of token ids"):
        loader([torch.zeros(2, 2)], global_batch_size=1, seq_len=1)


def test_unreadable_sources_say_what_is_read(tmp_path):
    (tmp_path / "notes.md").write_text("x")
    with pytest.raises(ConfigError, match=r"no data file to read \(found notes\.md\)"):
        loader(tmp_path, global_batch_size=1, seq_len=3)
    write_jsonl(tmp_path / "t.jsonl", TEXTS)
    numbered_rows(tmp_path / "r.npy", 3, 4)
    with pytest.raises(ConfigError, match=r"mixes text files and token files"):
        loader(tmp_path, global_batch_size=1, seq_len=3)
    with pytest.raises(ConfigError, match="cannot read a int"):
        loader(3, global_batch_size=1)
    with pytest.raises(ConfigError, match=r"Give the URI to the job as a channel"):
        loader("s3://bucket/data", global_batch_size=1)


# --- SageMaker channels ---


@pytest.fixture
def job_paths(tmp_path, monkeypatch):
    """An /opt/ml tree of this test (SAGEMAKER_BASE_DIR) and a working directory without data."""
    for name in [n for n in os.environ if n.startswith("SM_CHANNEL")] + ["SM_INPUT_DATA_CONFIG"]:
        monkeypatch.delenv(name, raising=False)
    base = tmp_path / "opt_ml"
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(base))
    monkeypatch.chdir(tmp_path)
    (base / "input" / "config").mkdir(parents=True)
    return base


def test_a_channel_name_reads_the_channel_directory(job_paths, monkeypatch):
    write_jsonl(job_paths / "input" / "data" / "train" / "t.jsonl", TEXTS)
    expected = stream(job_paths / "input" / "data" / "train")
    assert stream("train") == expected  # /opt/ml/input/data/train
    elsewhere = job_paths.parent / "mounted"
    write_jsonl(elsewhere / "part-0.jsonl", TEXTS)
    monkeypatch.setenv("SM_CHANNEL_TRAIN", str(elsewhere))  # FastFile mounts: the variable
    assert stream("train") == expected
    with pytest.raises(ConfigError, match=r"no channel of that name \(this job's channels: "
                                          r"none\)"):
        loader("validation", global_batch_size=1, seq_len=3)


def test_a_pipe_mode_channel_is_refused_with_the_reason(job_paths):
    config = {"train": {"TrainingInputMode": "Pipe", "S3DistributionType": "FullyReplicated",
                        "RecordWrapperType": "None"}}
    (job_paths / "input" / "config" / "inputdataconfig.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match=r"channel 'train' is in Pipe mode.*resume without "
                                          r"replaying.*input_mode='File' or 'FastFile'\.$"):
        loader("train", global_batch_size=1, seq_len=3)
    (job_paths / "input" / "config" / "inputdataconfig.json").write_text("{}")
    (job_paths / "input" / "data").mkdir(parents=True)
    os.mkfifo(job_paths / "input" / "data" / "train_0")  # what Pipe mode leaves: FIFOs
    with pytest.raises(ConfigError, match="Pipe mode"):
        loader("train", global_batch_size=1, seq_len=3)


@pytest.mark.parametrize(("failure", "expected"), [
    (ModuleNotFoundError("No module named 'datasets'", name="datasets"),
     "which is not installed: pip install 'meshtrain[data]'"),
    (ImportError("pyarrow requires NumPy 2.0 or newer, found 1.24.0"),
     "installed but does not import: pyarrow requires NumPy 2.0 or newer, found 1.24.0. "
     "Install versions of its dependencies that agree"),
])
def test_datasets_that_does_not_import_says_why(monkeypatch, failure, expected):
    import builtins

    real_import = builtins.__import__

    def failing_import(name, *args, **kwargs):
        if name == "datasets":
            raise failure
        return real_import(name, *args, **kwargs)

    monkeypatch.delitem(sys.modules, "datasets", raising=False)
    monkeypatch.setattr(builtins, "__import__", failing_import)
    with pytest.raises(ConfigError, match=re.escape(expected)):
        import_datasets(".parquet files")
