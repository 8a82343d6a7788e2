"""The loader's throughput, and whether it ever slows a training step (issue 40).

    python benchmarks/bench_data.py --json out.json          # the full run (a few minutes)
    python benchmarks/bench_data.py --smoke --json out.json  # tiny sizes, 2 rounds (a test)

One process, one thread (OMP_NUM_THREADS=1): the loader reads one data-parallel rank's rows and
ranks do not talk to each other while reading, so a rank's throughput is measured alone.

1. Throughput, tokens/s of rank 0 of dp 2 (its inputs' tokens over one pass of global batches),
   ``meshtrain_runtime.data.loader`` against torch's DataLoader + DistributedSampler (shuffle,
   drop_last, the same per-rank batch) over the same samples (a map-style Dataset of the
   loader's own samples, so both read the same arrays), with 0 and 2 worker processes, on
   .jsonl text tokenized as UTF-8 bytes and on a pre-tokenized 2-D .npy. The four sides run
   interleaved, round after round; the ratio is loader / DataLoader (above 1: the loader is
   faster). The text's index time (read, tokenize, pack, once when the loader is made) is
   reported beside it.
2. Step time: a small transformer language model trained with AdamW for a few steps per round,
   fed by the loader (its batches made in the step's path, 0 workers) and by the same batches
   held in memory, interleaved; the ratio is loader / in memory (goal <= 1.02), wall clock and
   CPU time.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
CORPUS = HERE.parent / "examples" / "data" / "corpus" / "train.jsonl"
STEP_GOAL = 1.02
FULL = {"copies": 20, "seq_len": 128, "global_batch": 32, "rounds": 10,
        "step_rounds": 15, "steps_per_round": 8, "dim": 128}
SMOKE = {"copies": 1, "seq_len": 32, "global_batch": 8, "rounds": 1,
         "step_rounds": 2, "steps_per_round": 2, "dim": 32}


def write_data(directory: Path, copies: int, seq_len: int) -> tuple[Path, Path]:
    """The repository's corpus repeated `copies` times as .jsonl, and its samples as .npy."""
    import numpy as np

    from meshtrain_runtime.data import loader

    text = directory / "text"
    text.mkdir()
    lines = CORPUS.read_text(encoding="utf-8")
    (text / "train.jsonl").write_text(lines * copies, encoding="utf-8")
    samples = loader(text, global_batch_size=1, seq_len=seq_len).data.samples
    rows = np.stack([samples.sample(i) for i in range(samples.num_samples)]).astype(np.int32)
    np.save(directory / "samples.npy", rows)
    return text, directory / "samples.npy"


class SampleDataset:
    """torch's side: sample i of the loader's own samples, as a tensor (map-style)."""

    def __init__(self, samples: Any) -> None:
        self.samples = samples

    def __len__(self) -> int:
        return self.samples.num_samples

    def __getitem__(self, index: int) -> Any:
        import torch

        return torch.from_numpy(self.samples.sample(index).astype("int64"))


def _torch_pass(samples: Any, rows: int, workers: int) -> int:
    """One pass of DataLoader + DistributedSampler (rank 0 of 2); the inputs' tokens read."""
    from torch.utils.data import DataLoader, DistributedSampler

    dataset = SampleDataset(samples)
    sampler = DistributedSampler(dataset, num_replicas=2, rank=0, shuffle=True, seed=0,
                                 drop_last=True)
    tokens = 0
    for batch in DataLoader(dataset, batch_size=rows, sampler=sampler, num_workers=workers,
                            drop_last=True):
        inputs, _targets = batch[:, :-1], batch[:, 1:]
        tokens += inputs.numel()
    return tokens


def _loader_pass(made: Any, state: dict[str, Any]) -> int:
    """One pass of the loader from its start; the inputs' tokens read."""
    made.load_state_dict(state)
    tokens = 0
    for inputs, _targets in made:
        tokens += inputs.numel()
    return tokens


def throughput(source: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Tokens/s of both sides, 0 and 2 workers, interleaved over the rounds."""
    from dataclasses import replace

    from meshtrain_runtime.data import Loader, loader

    start = time.perf_counter()
    made = loader(source, global_batch_size=settings["global_batch"], seq_len=settings["seq_len"],
                  dp_rank=0, dp_size=2)
    index_seconds = time.perf_counter() - start
    state = made.state_dict()
    rows = settings["global_batch"] // 2
    sides: dict[str, Callable[[], int]] = {}
    for workers in (0, 2):
        with_workers = Loader(made.data, replace(made.settings, num_workers=workers))
        sides[f"loader_w{workers}"] = lambda m=with_workers: _loader_pass(m, state)
        sides[f"torch_w{workers}"] = lambda w=workers: _torch_pass(made.data.samples, rows, w)
    rates: dict[str, list[float]] = {name: [] for name in sides}
    tokens: dict[str, int] = {}
    for _ in range(settings["rounds"]):
        for name, read in sides.items():
            begin = time.perf_counter()
            tokens[name] = read()
            rates[name].append(tokens[name] / (time.perf_counter() - begin))
    result = {name: statistics.median(values) for name, values in rates.items()}
    return {"tokens_per_s": result, "tokens_per_pass": tokens, "rounds": settings["rounds"],
            "ratio": {f"w{w}": result[f"loader_w{w}"] / result[f"torch_w{w}"] for w in (0, 2)},
            "index_seconds": index_seconds, "samples": made.num_samples}


def _model(vocab: int, dim: int) -> Any:
    import torch
    from torch import nn

    torch.manual_seed(0)
    layer = nn.TransformerEncoderLayer(dim, 4, 4 * dim, dropout=0.0, batch_first=True)
    return nn.ModuleDict({"embed": nn.Embedding(vocab, dim),
                          "blocks": nn.TransformerEncoder(layer, 2, enable_nested_tensor=False),
                          "head": nn.Linear(dim, vocab)})


def _train(model: Any, optimizer: Any, batches: Iterable[Any]) -> None:
    import torch

    for inputs, targets in batches:
        seq = inputs.shape[1]
        mask = torch.triu(torch.full((seq, seq), float("-inf")), 1)
        hidden = model["blocks"](model["embed"](inputs), mask=mask, is_causal=True)
        logits = model["head"](hidden)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()


def step_time(source: Path, settings: dict[str, Any]) -> dict[str, Any]:
    """Rounds of a few training steps fed by the loader vs by the same batches in memory."""
    import torch

    from meshtrain_runtime.data import loader

    steps = settings["steps_per_round"]
    made = loader(source, global_batch_size=settings["global_batch"],
                  seq_len=settings["seq_len"], steps=steps, dp_rank=0, dp_size=2)
    start = made.state_dict()
    memory = [made.batch(k) for k in range(steps)]
    model = _model(made.vocab_size or 257, settings["dim"])
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)

    def fed_by_loader() -> None:
        made.load_state_dict(start)
        _train(model, optimizer, made)

    _train(model, optimizer, memory)  # warm-up: the optimizer's state, the allocator
    wall: list[float] = []
    cpu: list[float] = []
    for _ in range(settings["step_rounds"]):
        times = {}
        for name, run in (("loader", fed_by_loader), ("memory", lambda: _train(
                model, optimizer, memory))):
            wall0, cpu0 = time.perf_counter(), time.process_time()
            run()
            times[name] = (time.perf_counter() - wall0, time.process_time() - cpu0)
        wall.append(times["loader"][0] / times["memory"][0])
        cpu.append(times["loader"][1] / times["memory"][1])
    return {"wall": _summary(wall), "cpu": _summary(cpu), "steps_per_round": steps,
            "rounds": settings["step_rounds"], "goal": STEP_GOAL,
            "goal_met": _summary(wall)["median"] <= STEP_GOAL
            and _summary(cpu)["median"] <= STEP_GOAL}


def _summary(values: list[float]) -> dict[str, float]:
    ordered = sorted(values)
    q1, _, q3 = (statistics.quantiles(ordered, n=4, method="inclusive") if len(ordered) > 1
                 else (ordered[0],) * 3)
    return {"median": statistics.median(ordered), "q1": q1, "q3": q3, "n": len(ordered)}


def run(smoke: bool) -> dict[str, Any]:
    import torch

    torch.set_num_threads(1)
    settings = SMOKE if smoke else FULL
    with tempfile.TemporaryDirectory(prefix="meshtrain-bench-data-") as tmp:
        text, npy = write_data(Path(tmp), settings["copies"], settings["seq_len"])
        return {"settings": settings, "load_start": list(os.getloadavg()),
                "text_jsonl": throughput(text, settings), "tokens_npy": throughput(npy, settings),
                "step_time": step_time(text, settings), "load_end": list(os.getloadavg())}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--smoke", action="store_true")
    parser.add_argument("--json", type=Path, required=True)
    args = parser.parse_args(argv)
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    result = run(args.smoke)
    args.json.write_text(json.dumps(result, indent=1) + "\n")
    print(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
