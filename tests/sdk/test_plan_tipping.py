""""Does not fit" names the peak phase and the term that tips it, for every phase.

The optimizer-step case by the real numbers (Llama-2-70B on 4 p4d, checkpointing: foreach
AdamW's fp32 step buffer tips it), and each phase by an estimate whose phases are set so that
phase peaks, in the CLI's reasoning, the pre-flight's memory text and the JSON.
"""

from __future__ import annotations

import dataclasses
import json

import pytest

from meshtrain.contract import SMPParameters
from meshtrain.plan import PRESETS, Training, build_cluster, estimate_layout
from meshtrain.plan.cli import plan_main
from meshtrain.plan.layouts import reasoning, tipping_term
from meshtrain.plan.phases import PHASES, PhaseMemory
from meshtrain.plan.report import memory_text

GIB = 2**30


def test_cli_names_the_optimizer_step_buffer(capsys):
    """Llama-2-70B over 32 A100s (40 GiB, 37.0 usable) with checkpointing: states 32.1 GiB,
    the step adds the sharded gradients, and foreach AdamW's sqrt temporary (8.0 GiB, 4 bytes
    per local parameter) is the smallest term without which the step would fit."""
    assert plan_main(["--model", "llama2-70b", "--instance-type", "ml.p4d.24xlarge",
                      "--instance-count", "4", "--json", "--top", "1"]) == 0
    best = json.loads(capsys.readouterr().out)["candidates"][0]
    assert best["memory_bytes"]["peak_phase"] == "optimizer_step"
    step = best["memory_bytes"]["phases"]["optimizer_step"]
    # One fp32 temporary per local parameter: as large as the fp32 sharded parameters.
    assert step["terms"]["optimizer_step_buffer"] == step["terms"]["sharded_parameters"]
    assert step["total"] > best["memory_bytes"]["capacity"] >= \
        step["total"] - step["terms"]["optimizer_step_buffer"]
    assert "peak in the optimizer step phase; optimizer step buffer 8.0 GiB tips it" \
        in best["reasoning"]


def _with_phases(big: str) -> object:
    """A real estimate whose phase `big` is made the peak, 10 GiB over a 30 GiB capacity,
    with one 4 GiB buffer term that tips it."""
    estimate = estimate_layout(PRESETS["llama2-7b"], SMPParameters(), build_cluster(gpus=8),
                               Training(seq_len=1024))
    phases = []
    for name in PHASES:
        terms = {"sharded_parameters": 8 * GIB, "optimizer_states": 16 * GIB}
        if name == big:
            terms |= {"activations": 12 * GIB, "gathered_parameters": 4 * GIB}
        phases.append(PhaseMemory(name, terms))
    memory = dataclasses.replace(estimate.memory, phases=tuple(phases))
    return dataclasses.replace(estimate, memory=memory, capacity_bytes=30 * GIB)


@pytest.mark.parametrize("phase", PHASES)
def test_every_phase_is_named_with_its_tipping_term(phase):
    """40 GiB > 30 GiB: without activations (12) or optimizer states (16) it would fit, not
    without the 4 GiB buffer: the smallest sufficient term is the activations."""
    estimate = _with_phases(phase)
    assert estimate.fits is False
    label = phase.replace("_", " ")
    assert tipping_term(estimate.memory.peak_phase, estimate.capacity_bytes) == "activations"
    text = memory_text(estimate)
    assert f"peak in the {label} phase" in text
    assert f"what tips it: activations (12.0 GiB in the {label} phase)" in text
    plan = type("P", (), {"cluster": build_cluster(gpus=8)})()
    assert f"peak in the {label} phase; activations 12.0 GiB tips it" in reasoning(estimate, plan)
