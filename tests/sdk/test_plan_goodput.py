"""`meshtrain plan --goodput` (meshtrain.plan.goodput): the closed form against a seeded Monte
Carlo run of the same failures, the recommended checkpoint interval against the best one the
simulation finds, the published cases docs/fault-tolerance.md reproduces, and the CLI."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from meshtrain.cli import main as meshtrain_main
from meshtrain.contract.errors import ConfigError
from meshtrain.plan.goodput import (
    LLAMA3_GPU_MTBF_HOURS,
    GoodputInputs,
    estimate_goodput,
    recommended_interval,
)
from meshtrain.plan.goodput_cli import inputs_from_args
from meshtrain.plan.goodput_sim import best_interval, simulate

DOCS = Path(__file__).resolve().parents[2] / "docs" / "fault-tolerance.md"
GPUS_PER_GROUP = 512


@pytest.mark.parametrize("gpus", [1024, 16_384, 131_072])
@pytest.mark.parametrize("gpu_mtbf_hours", [10_000.0, LLAMA3_GPU_MTBF_HOURS, 200_000.0])
def test_the_closed_form_agrees_with_a_simulation_within_a_point(gpus, gpu_mtbf_hours):
    """Full restarts and replica groups of 512 GPUs, each with its own recommended interval:
    20,000 simulated failures (seeded) within 1 point of goodput of the closed form."""
    inputs = GoodputInputs(gpus=gpus, gpu_mtbf_hours=gpu_mtbf_hours,
                           replica_groups=gpus // GPUS_PER_GROUP, restart_seconds=600,
                           checkpoint_write_seconds=30, checkpoint_load_seconds=60,
                           group_restart_seconds=180, heal_seconds=20, stall_seconds=10)
    estimate = estimate_goodput(inputs)
    full_inputs = GoodputInputs(**{**inputs.__dict__, "replica_groups": 1})
    cases = [(full_inputs, estimate.full_restarts), (inputs, estimate.replica_groups)]
    for case_inputs, strategy in cases:
        simulated = simulate(case_inputs, strategy.checkpoint_interval_seconds,
                             failures=20_000, seed=7)
        assert abs(simulated - strategy.goodput) <= 0.01, (strategy, simulated)
    assert estimate.replica_groups.goodput > estimate.full_restarts.goodput


@pytest.mark.parametrize(("gpus", "gpu_mtbf_hours", "write", "restart"), [
    (16_384, LLAMA3_GPU_MTBF_HOURS, 15, 300),
    (1024, 50_000.0, 60, 600),
    (100_000, 24_000.0, 5, 540),
])
def test_the_recommended_interval_is_within_5_percent_of_the_simulations_best(
        gpus, gpu_mtbf_hours, write, restart):
    inputs = GoodputInputs(gpus=gpus, gpu_mtbf_hours=gpu_mtbf_hours,
                           checkpoint_write_seconds=write, restart_seconds=restart)
    recommended = estimate_goodput(inputs).full_restarts.recommended_interval_seconds
    best = best_interval(inputs, recommended, failures=12_000, seed=3, points=11)
    assert abs(best / recommended - 1) <= 0.05, (recommended, best)


def test_young_is_the_first_order_of_the_recommended_interval():
    assert recommended_interval(1.0, 1e8) == pytest.approx((2 * 1e8) ** 0.5, rel=1e-3)
    assert recommended_interval(300.0, 100.0) == 100.0  # a write of 2 M or more: M
    assert recommended_interval(0.0, 5000.0) == 5000.0


# --- the published cases (docs/fault-tolerance.md: the inputs assumed beside each figure) ----

LLAMA3 = ["--gpus", "16384", "--restart-seconds", "300", "--checkpoint-write-seconds", "15",
          "--checkpoint-load-seconds", "60"]
FT_HSDP = ["--gpus", "100000", "--gpu-mtbf-hours", "24000", "--restart-seconds", "540",
           "--checkpoint-write-seconds", "5", "--checkpoint-load-seconds", "60",
           "--replica-groups", "48", "--stall-seconds", "180", "--group-restart-seconds", "540",
           "--heal-seconds", "60"]


def _plan(capsys, args: list[str]) -> dict:
    assert meshtrain_main(["plan", "--goodput", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_llama3_405b_keeps_over_90_percent_with_full_restarts(capsys):
    """466 interruptions in 54 days on 16,384 H100s (arXiv 2407.21783) is the default rate."""
    full = _plan(capsys, LLAMA3)["strategies"][0]
    assert full["name"] == "full restarts" and full["goodput"] > 0.90


def test_ft_hsdp_at_100k_gpus_goes_from_44_to_80_percent(capsys):
    """arXiv 2602.00277: a 10-minute stall per failure synchronously, 3 minutes with FT-HSDP."""
    full, groups = _plan(capsys, FT_HSDP)["strategies"]
    assert full["goodput"] == pytest.approx(0.44, abs=0.02)
    assert groups["goodput"] == pytest.approx(0.80, abs=0.02)


def test_the_docs_show_what_these_commands_print(capsys):
    """docs/fault-tolerance.md's figures are the planner's output for its commands."""
    text = DOCS.read_text()
    for args in (LLAMA3, FT_HSDP):
        command = "meshtrain plan --goodput " + " ".join(args)
        assert command in text, command
        for strategy in _plan(capsys, args)["strategies"]:
            shown = f"| {strategy['name']} | {strategy['goodput']:.1%} |"
            assert shown in text, shown


# --- inputs -------------------------------------------------------------------------------

@pytest.mark.parametrize(("changes", "message"), [
    ({"gpus": 0}, "at least 1 GPU"),
    ({"gpu_mtbf_hours": 0.0}, "hours between failures of one GPU"),
    ({"replica_groups": 9, "gpus": 8}, "between 1 (full restarts) and the 8 GPUs"),
    ({"stall_seconds": -1.0}, "a duration in seconds"),
    ({"checkpoint_interval_seconds": 0.0}, "training seconds between checkpoints"),
])
def test_impossible_inputs_are_config_errors(changes, message):
    with pytest.raises(ConfigError, match=re.escape(message)) as error:
        GoodputInputs(**{"gpus": 8, **changes})
    assert str(error.value).endswith(".") and not str(error.value).endswith("..")


def test_a_jobs_measured_times_are_the_defaults_and_flags_win(capsys):
    parser_args = ["plan", "--goodput", "--gpus", "64", "--heal-seconds", "3"]
    from meshtrain.cli import build_parser

    args = build_parser().parse_args(parser_args)
    args.from_job = "ft"
    measured = {"GroupRestartSeconds": 7.5, "HealSeconds": 1.25, "StallSeconds": 2.0,
                "CheckpointWriteSeconds": None, "CheckpointLoadSeconds": 0.5}
    inputs = inputs_from_args(args, 64, measured)
    assert (inputs.group_restart_seconds, inputs.stall_seconds) == (7.5, 2.0)
    assert inputs.checkpoint_load_seconds == 0.5
    assert inputs.heal_seconds == 3.0  # the flag
    assert inputs.checkpoint_write_seconds == GoodputInputs(gpus=1).checkpoint_write_seconds
    assert inputs.measured == {"group_restart_seconds": "measured by ft",
                               "stall_seconds": "measured by ft",
                               "checkpoint_load_seconds": "measured by ft"}


def test_goodput_needs_the_jobs_size(capsys):
    assert meshtrain_main(["plan", "--goodput"]) == 2
    assert "--goodput needs the job's size: --gpus N" in capsys.readouterr().err
