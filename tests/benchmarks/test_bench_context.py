"""benchmarks/bench_context.py: its smoke run (one 2-rank launch, tiny shapes).

What does not depend on the machine is checked exactly: the bytes every rank sends in one
forward and one backward of meshtrain's cp attention, per cp_comm_type and dtype, equal the
planner's (meshtrain.plan.context), and those are the hand-derived figures of the smoke shape;
meshtrain's output equals the hand-written baseline's; the ratios carry quartiles beside the
null layout. The step-time figures themselves are benchmarks/RESULTS.md's.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[2] / "benchmarks"
sys.path.insert(0, str(BENCH))

import report  # noqa: E402
import run_all  # noqa: E402

# The smoke shape: cp 2, sequence 64, 4 heads, 2 key/value heads of 8. A rank holds 32 tokens:
# its k (or v) is 32 x 2 x 8 = 512 elements, its q (or output) 1024; cp - 1 = 1 hop. Bytes one
# rank sends (forward, backward) by dtype; the ring and all_gather send the key/value gradients
# in fp32 (4 bytes) whatever the dtype.
BY_HAND = {
    # k, v once; backward: k, v once more and dk, dv twice (one hop more, home)
    ("p2p", "float32"): (2 * 512 * 4, 2 * 512 * 4 + 2 * 2 * 512 * 4),
    ("p2p", "bfloat16"): (2 * 512 * 2, 2 * 512 * 2 + 2 * 2 * 512 * 4),
    # gathered in forward, gathered again in backward, then dk, dv reduce-scattered
    ("all_gather", "float32"): (2 * 512 * 4, 2 * 512 * 4 + 2 * 512 * 4),
    ("all_gather", "bfloat16"): (2 * 512 * 2, 2 * 512 * 2 + 2 * 512 * 4),
    # half of q, k, v and the output leave the rank, each way (autograd: the compute dtype)
    ("a2a", "float32"): ((1024 + 2 * 512 + 1024) / 2 * 4,) * 2,
    ("a2a", "bfloat16"): ((1024 + 2 * 512 + 1024) / 2 * 2,) * 2,
}
OPS = {"p2p": {"batch_isend_irecv"}, "all_gather": {"all_gather", "all_to_all_single"},
       "a2a": {"all_to_all_single"}}


@pytest.fixture(scope="module")
def smoke(tmp_path_factory: pytest.TempPathFactory) -> dict:
    out = tmp_path_factory.mktemp("bench_context") / "c.json"
    done = subprocess.run([sys.executable, str(BENCH / "bench_context.py"), "--smoke",
                           "--json", str(out)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_bytes_equal_the_planner_and_the_hand_derivation(smoke: dict) -> None:
    assert smoke["cp"] == 2 and smoke["bytes_equal_theory"] is True
    for (comm_type, dtype), (forward, backward) in BY_HAND.items():
        entry = smoke["bytes"][comm_type][dtype]
        assert entry["theory"] == {"forward": forward, "backward": backward}, (comm_type, dtype)
        assert entry["measured_per_rank"] == [entry["theory"]] * 2, (comm_type, dtype)
        ops = {op for phase in entry["by_op"][0].values() for op in phase}
        assert ops == OPS[comm_type]


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_outputs_equal_the_hand_written_attention(smoke: dict) -> None:
    for name, difference in smoke["max_abs_diff_vs_by_hand"].items():
        assert difference < 1e-5, name


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_ratios_beside_the_null_layout(smoke: dict) -> None:
    ratio = smoke["ratio"]
    for side in ("all_gather", "p2p", "a2a", "null"):
        for kind in ("wall", "cpu"):
            entry = ratio[f"{side}_{kind}"]
            assert entry["n"] == 2 and entry["q1"] <= entry["median"] <= entry["q3"]
    assert set(smoke["step_ms"]) == {"all_gather", "by_hand", "null", "p2p", "a2a"}
    assert smoke["load"]["start"] and smoke["load"]["end"]


@pytest.mark.multiprocess  # a smoke run of the benchmark: torchrun / subprocess ranks
def test_smoke_report_renders_the_context_section(smoke: dict) -> None:
    built = report.build_report([], machine={"description": "m"}, context=smoke)
    assert built["goals_met"]["context_bytes_equal_planner"] is True
    table = report.render_markdown(built)
    assert "| p2p | bfloat16 | 2,048 / 10,240 | 2,048 / 10,240 | yes |" in table


def test_a_full_run_includes_the_context_benchmark() -> None:
    source = (BENCH / "run_all.py").read_text()
    assert '"bench_context.py"' in source and "context=context" in source
    assert run_all.parse_args([]).rounds >= run_all.MIN_PAIRS
