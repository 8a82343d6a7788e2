"""Every example (launch scripts and notebook cells) names the jobs it runs, so that `meshtrain
list` tells them apart (`quickstart-<time>`, not `meshtrain-<time>`): each Estimator an example
fits has a base_job_name. Estimators made only to plan (`plan_model=`, pre-flight, nothing
launched) and files that never fit one (kubernetes/render.py names its manifest) need none."""

from __future__ import annotations

import re
from pathlib import Path

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def estimator_calls(text: str) -> list[str]:
    """The argument text of every `Estimator(...)` call in `text` (balanced parentheses)."""
    calls = []
    for match in re.finditer(r"\bEstimator\(", text):
        depth, start = 1, match.end()
        for index in range(start, len(text)):
            depth += {"(": 1, ")": -1}.get(text[index], 0)
            if depth == 0:
                calls.append(text[start:index])
                break
    return calls


def test_every_estimator_an_example_fits_names_its_jobs():
    checked, unnamed = 0, []
    for path in sorted(EXAMPLES.rglob("*.py")):
        text = path.read_text()
        if ".fit(" not in text:
            continue
        for call in estimator_calls(text):
            if "plan_model=" in call:
                continue
            checked += 1
            if "base_job_name=" not in call:
                unnamed.append(f"{path.relative_to(EXAMPLES)}: Estimator({call[:60]}...")
    assert not unnamed, "examples whose jobs are named meshtrain-<time>:\n" + "\n".join(unnamed)
    assert checked >= 15  # every launch script and notebook that runs a job was read


def test_the_scan_finds_an_unnamed_estimator():
    text = 'estimator = Estimator(entry_point="t.py", hyperparameters={"a": (1)})\nestimator.fit()'
    assert estimator_calls(text) == ['entry_point="t.py", hyperparameters={"a": (1)}']
