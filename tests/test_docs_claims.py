"""README, docs/ and the examples' READMEs say only what is true about what meshtrain does.

Every hedge they make ("not in this build", "not yet", "not tested", "cannot be combined", ...)
must stand in `STILL_TRUE` with why it still holds: where the code can show it (a refusal), a
check that fails the day the code does the thing, so the doc is fixed with the code. A hedge
that is in no list fails (a new one is argued here first), and so does a listed one that the
docs no longer make (the list stays the docs' own). `RETRACTED` holds hedges that were false
when found (issue 46): the code does what they denied, shown by the named test or result, and
they must not come back.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from pathlib import Path

import pytest

from meshtrain.contract.errors import ConfigError

ROOT = Path(__file__).resolve().parents[1]
HEDGE = re.compile(r"not in this build|in this build|not yet|not tested|untested|"
                   r"cannot be combined|not supported yet|not on a GPU", re.IGNORECASE)


def _docs() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")),
            *sorted((ROOT / "examples").glob("*/README.md"))]


def _fault_tolerance_refuses_other_parallelisms() -> None:
    from meshtrain.contract.degrees import resolve_degrees
    from meshtrain.contract.distribution import DistributionConfig
    from meshtrain.contract.fault_tolerance_checks import check_fault_tolerance

    for parameters in ({"tensor_parallel_degree": 2}, {"expert_parallel_degree": 2},
                       {"context_parallel_degree": 2},
                       {"pipeline_parallel_degree": 2, "microbatches": 2}):
        config = DistributionConfig.from_dict({
            "torch_distributed": {"enabled": True, "processes_per_host": 4,
                                  "fault_tolerance": {"replica_groups": 2}},
            "smdistributed": {"modelparallel": {"enabled": True, "parameters": {
                "hybrid_shard_degree": 4 // parameters.get("pipeline_parallel_degree", 1)
                // parameters.get("tensor_parallel_degree", 1), **parameters}}}})
        degrees = resolve_degrees(config.smp, 8, ranks_per_host=4)
        with pytest.raises(ConfigError, match="run hybrid sharding only"):
            check_fault_tolerance(config, instance_count=2, processes_per_host=4,
                                  degrees=degrees)


def _kubernetes_takes_no_rendezvous() -> None:
    from meshtrain.targets import resolve_target

    assert "rendezvous" not in resolve_target("k8s:ml.p4d.24xlarge").options


Check = Callable[[], None]
STILL_TRUE: dict[tuple[str, str], str | Check] = {
    # (file, text on the hedge's line): a check the code passes while the hedge is true, or
    # why it holds where nothing in the code can show it
    ("docs/fault-tolerance.md", "are refused with it in this build"):
        _fault_tolerance_refuses_other_parallelisms,
    ("docs/fault-tolerance.md", "fp16 with a gradient scaler is not tested with replica"):
        "tests/runtime/test_fault_tolerance_unit.py checks only that a followed scaler grows on "
        "committed steps; no job with replica groups trains in fp16 (a GPU path)",
    ("docs/kubernetes.md", "## Not yet"): _kubernetes_takes_no_rendezvous,  # its one item
    ("docs/pipeline-parallel.md", "## Not yet"):
        "a roadmap: the planner's pipeline terms are formulas, not calibrated on pipelined runs",
    ("docs/performance.md", "one not yet reached reads `cut`"):
        "not a claim about the code: a report's section the budget did not reach",
    ("docs/planner.md", "`sac_offload_bf16`): not yet on a GPU"):
        "benchmarks/results holds no GPU report with the selective pairs yet (issue 47 added "
        "them after the H200 run)",
    ("docs/data.md", "not yet with a loader"):
        "the fault-tolerance tests resume checkpoints of scripts without meshtrain's loader",
    ("docs/slurm.md", "Not tested:"):
        "tests/slurm/ runs no stop() of a fault-tolerant Slurm job and no requeue after Slurm "
        "marks a node down",
}
RETRACTED: dict[tuple[str, str], str] = {
    # (file, words that were false) -> what shows the code does it (a file, or file::text)
    ("README.md", "not yet run on a GPU"): "benchmarks/results/gpu-nvidia-h200-2026-11-27.md",
    ("docs/planner.md", "not on a GPU since"): "benchmarks/results/gpu-nvidia-h200-2026-11-27.md",
    ("docs/performance.md", "pipeline parallelism are not in this build"):
        "tests/runtime/test_pipeline_parity.py",
    ("benchmarks/gpu_check.py", "not in this build"): "tests/runtime/test_context_parallel.py",
    ("docs/runtime-api.md", "1 / 0 in this build"): "tests/runtime/test_pipeline.py",
    ("docs/expert-parallel.md", "across EP layouts is not tested"):
        "tests/runtime/test_checkpoint_multiprocess.py::ep2_to_ep1",
    ("examples/mixtral_ep/README.md", "cannot be combined with tensor parallelism"):
        "tests/runtime/test_expert_parallel_tp.py::test_tp_x_ep_mixtral_matches_one_process",
}


def _hedges() -> list[tuple[str, int, str]]:
    """(file, line number, line) of every hedge the docs make."""
    found = []
    for path in _docs():
        for number, line in enumerate(path.read_text().splitlines(), 1):
            if HEDGE.search(line):
                found.append((str(path.relative_to(ROOT)), number, line))
    return found


def test_every_hedge_in_the_docs_is_argued_here():
    unargued = [f"{name}:{number}: {line.strip()}" for name, number, line in _hedges()
                if not any(name == file and text in line for file, text in STILL_TRUE)]
    assert not unargued, ("a hedge nobody argued: make it true (or drop it), or add it to "
                          "STILL_TRUE with its check:\n" + "\n".join(unargued))


def test_every_argued_hedge_is_still_made_and_still_true():
    hedges = _hedges()
    for (file, text), why in STILL_TRUE.items():
        assert any(name == file and text in line for name, _, line in hedges), (
            f"{file} no longer says {text!r}: remove it from STILL_TRUE")
        if callable(why):
            why()  # raises when the code now does what the doc says it does not


@pytest.mark.parametrize(("file", "words"), sorted(RETRACTED))
def test_a_retracted_hedge_does_not_come_back(file, words):
    assert words not in (ROOT / file).read_text(), f"{file} says {words!r} again"
    evidence = RETRACTED[(file, words)]
    path, _, text = evidence.partition("::")
    assert (ROOT / path).is_file(), f"{evidence} is gone: is {words!r} true again?"
    assert text in (ROOT / path).read_text(), f"{evidence} is gone: is {words!r} true again?"


def test_the_hedge_pattern_finds_what_it_must():
    for hedge in ("is not tested here", "not in this build", "Not yet", "cannot be combined "
                  "with tensor parallelism", "refused in this build"):
        assert HEDGE.search(hedge), hedge
    assert not HEDGE.search("tested on 4 ranks")
