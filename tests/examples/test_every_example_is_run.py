"""A new example or notebook fails here until a test that pytest collects runs it.

RUNNERS names, for each folder under examples/ and each notebook, the test that runs it (by its
test id); the guard asks pytest which tests it collects (`pytest --collect-only -q` on the
runners' files, in a subprocess) and fails for an example whose test is gone or never named.
A test deleted while its path is still mentioned in a comment fails here (it is not collected).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
EXAMPLES = ROOT / "examples"
_EX = "tests/examples/test_examples.py::"
_NB = "tests/examples/test_notebooks.py::"
# example folder (or "notebooks/<name>") -> the test that runs it; a parametrized test's id is
# named without its parameters
RUNNERS = {
    "activation_checkpointing": _EX + "test_activation_checkpointing_and_offloading",
    "data": "tests/examples/test_corpus.py::test_the_corpus_is_the_generators_output",
    "fault_tolerance": _EX + "test_fault_tolerance_example",
    "kubernetes": _EX + "test_kubernetes_manifest_is_valid_for_kubectl",
    "llama_context": "tests/examples/test_example_llama_context.py::test_llama_context_parallel",
    "llama_pipeline": _EX + "test_llama_pipeline_parallel",
    "llama_tp_hsdp": _EX + "test_llama_tensor_parallel_hybrid_sharding",
    "local_docker": "tests/docker/test_docker_example.py::"
                    "test_local_docker_example_matches_local_processes",
    "mixtral_ep": _EX + "test_mixtral_expert_parallel",
    "planning": _EX + "test_planning_runs_without_torch",
    "quickstart": "tests/e2e/test_quickstart.py::test_quickstart_job_trains_and_saves_the_model",
    "resume_other_layout": _EX + "test_resume_on_another_layout",
    "sagemaker": _EX + "test_sagemaker_launch_against_moto",
    "smp_v2": _EX + "test_smp_v2_script_resumes_where_it_stopped",
    "slurm": "tests/slurm/test_slurm_jobs.py::"
             "test_quickstart_on_slurm_matches_local_and_leaves_the_model",
    "stop_and_resume": _EX + "test_stop_resume_and_restart",
    "notebooks/fault_tolerance": _NB + "test_fault_tolerance_notebook",
    "notebooks/llama_pipeline": _NB + "test_llama_pipeline_notebook",
    "notebooks/planning": _NB + "test_planning_notebook",
    "notebooks/quickstart": _NB + "test_quickstart_notebook",
    "notebooks/resume_other_layout": _NB + "test_resume_notebook",
    "notebooks/sagemaker": _NB + "test_sagemaker_notebook_against_moto",
    "notebooks/sagemaker_v3": _NB + "test_sagemaker_v3_notebook_against_moto",
    "notebooks/stop_and_resume": _NB + "test_stop_and_resume_notebook",
}


def examples_on_disk() -> list[str]:
    """Every example folder and every notebook ("notebooks/<name>") under examples/."""
    folders = [p.name for p in EXAMPLES.iterdir() if p.is_dir() and p.name != "notebooks"
               and not p.name.startswith((".", "_"))]
    notebooks = [f"notebooks/{p.stem}" for p in (EXAMPLES / "notebooks").glob("*.ipynb")]
    return sorted(folders + notebooks)


def collected_ids(files: set[str]) -> set[str]:
    """The test ids pytest collects from `files` (relative to the checkout)."""
    env = {k: v for k, v in os.environ.items() if k not in ("CI", "PYTEST_ADDOPTS")}
    run = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p",
                          "no:xdist", "-p", "no:cacheprovider", *sorted(files)],
                         cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    return {line.strip() for line in run.stdout.splitlines() if "::" in line}


def not_run(examples: list[str], runners: dict[str, str], ids: set[str]) -> list[str]:
    """The examples without a collected test: none named in `runners`, or not in `ids` (a
    parametrized test counts when any of its cases is collected)."""
    def found(test: str) -> bool:
        return test in ids or any(i.startswith(test + "[") for i in ids)

    return [name for name in examples if name not in runners or not found(runners[name])]


@pytest.fixture(scope="module")
def ids() -> set[str]:
    return collected_ids({test.split("::")[0] for test in RUNNERS.values()})


def test_every_example_and_notebook_is_run_by_a_collected_test(ids):
    examples = examples_on_disk()
    assert len([e for e in examples if not e.startswith("notebooks/")]) >= 10
    assert len([e for e in examples if e.startswith("notebooks/")]) >= 5
    assert not_run(examples, RUNNERS, ids) == []
    assert sorted(RUNNERS) == examples  # no runner left for an example that is gone


def test_the_guard_fails_when_an_examples_test_is_removed(ids):
    """Each example's test taken out of the collected ids (as if deleted, its path left in a
    comment) is reported; so is a new folder nobody runs."""
    examples = examples_on_disk()
    for name, test in RUNNERS.items():
        remaining = {i for i in ids if i != test and not i.startswith(test + "[")}
        assert not_run(examples, RUNNERS, remaining) == [name]
    assert not_run([*examples, "new_example"], RUNNERS, ids) == ["new_example"]
