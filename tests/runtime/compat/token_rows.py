"""A tiny on-disk dataset in the format AWS's SMP v2 scripts read (``dataset_type: gpt_jsonl``).

``GPTPretrainingDataset`` reads every ``*.json`` file of ``training_dir`` (``zipped_data: 0``):
one JSON object a line with ``input_ids`` and ``attention_mask``. Rows exactly
``max_context_width`` long are never cropped (a longer row gets a random window), and the
scripts' sampler does not shuffle, so a job resumed with the checkpoint's
``resume_from_sequence_number`` reads the batches an uninterrupted job read at those steps.
"""

from __future__ import annotations

import json
import random
from pathlib import Path


def write_token_rows(folder: Path, rows: int, width: int, vocab: int, seed: int = 0) -> Path:
    """Write ``rows`` random rows of ``width`` tokens to ``folder/train.json``; return folder."""
    rng = random.Random(seed)
    folder.mkdir(parents=True, exist_ok=True)
    lines = [
        json.dumps({"input_ids": [rng.randrange(vocab) for _ in range(width)],
                    "attention_mask": [1] * width})
        for _ in range(rows)
    ]
    (folder / "train.json").write_text("\n".join(lines) + "\n")
    return folder
