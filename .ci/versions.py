#!/usr/bin/env python3
"""CI's version tier: a named subset of the tests in fresh environments at both ends of the
ranges pyproject.toml declares, so that what pyproject declares is what CI tests.

Each environment is a new virtual environment: torch first (as README's commands do), then
``pip install -e '.[runtime,hf,dev]'`` under a constraints file that pins that environment's
ends of the ranges; it prints the versions it got, then runs `SUBSET` with ``CI=true`` (a skip
fails, tests/ci_guards.py). An environment that cannot be built fails the tier, with pip's
output; nothing is skipped. The floors come from pyproject itself (``name>=X`` -> ``name==X``),
so raising a floor there moves what this tier installs. docs/compatibility.md holds the table
these environments measured.

    python3 .ci/versions.py                    # every environment, one after another
    python3 .ci/versions.py --only newest      # one of them
    python3 .ci/versions.py --pin newest:transformers==5.23.0   # break one on purpose
    python3 .ci/versions.py --list             # the environments and the subset
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
EXTRAS = "runtime,hf,dev"  # what README's test command installs
TORCH_FLOOR_PACKAGES = ("torch", "torchao")  # torchao's releases are made for torch releases
SHOWN = ("torch", "transformers", "torchao", "torchft", "numpy", "pydantic", "boto3",
         "kubernetes", "huggingface-hub", "accelerate", "safetensors", "pytest", "pytest-xdist",
         "hypothesis", "moto", "sagemaker", "tensorboard", "rich", "datasets")


@dataclass(frozen=True)
class Environment:
    """One fresh environment of the tier."""

    name: str
    torch: str | None  # None: pyproject's floor
    why: str
    floors: tuple[str, ...] = ()  # "torch": TORCH_FLOOR_PACKAGES; "libraries": all others
    pins: tuple[str, ...] = field(default=())  # requirement lines added to the constraints
    without: tuple[str, ...] = ()  # test-extra packages left out (named with the reason)


ENVIRONMENTS = (
    Environment(
        "newest", "2.15.0",
        "the newest torch release (downloaded: about 2.3 GB with its CUDA libraries, which run "
        "on CPU) with the newest release of every other package"),
    # torch's floor is README's pin: torch 2.10-2.12 fail the subset (docs/compatibility.md),
    # so one environment holds both ends' floors
    Environment(
        "floors", None,
        "every package at the floor pyproject declares: torch (README's pin) and torchao, "
        "transformers, numpy, pydantic, boto3, kubernetes, the test extras; without the "
        "SageMaker SDK, whose pinned release needs boto3 >= 1.42.2 and numpy >= 1.26.4 "
        "(README's command tests it)",
        floors=("torch", "libraries"), without=("sagemaker",),
        # pyarrow (datasets' reader, not meshtrain's dependency) refuses numpy < 2 at import
        # from 26.0 on without declaring it; 25 is the newest that imports beside numpy 1.24
        pins=("pyarrow<26",)),
)

SUBSET = (
    # multi-process parity with one process: hybrid sharding, TP, PP (the HF Llama included),
    # CP, EP, TP x EP
    "tests/runtime/test_hsdp_layouts.py::test_loss_parity_with_one_process",
    "tests/runtime/test_hsdp_layouts.py::"
    "test_fp8_with_float8_all_gather_matches_one_process_of_the_same_micro_batches",
    "tests/runtime/test_hsdp_layouts.py::test_meta_llama_is_initialised_like_hf",  # HF's init
    "tests/runtime/test_tensor_parallel_multiprocess.py::test_loss_matches_single_process",
    "tests/runtime/test_pipeline_parity.py::test_loss_and_clip_norm_match_one_process",
    "tests/runtime/test_context_parallel.py::test_every_steps_mean_loss_matches_one_process",
    "tests/runtime/test_context_parallel.py::test_other_hf_families_match_one_process",
    "tests/runtime/test_expert_parallel.py::"
    "test_mixtral_output_loss_and_gradients_match_one_process",
    "tests/runtime/test_expert_parallel.py::test_meshtrain_moe_layer_matches_one_process",
    "tests/runtime/test_expert_parallel_tp.py::test_tp_x_ep_mixtral_matches_one_process",
    # checkpoints resumed on another layout, and exported to Hugging Face
    "tests/runtime/test_checkpoint_multiprocess.py::test_resume_on_another_layout_of_two_ranks",
    "tests/runtime/test_checkpoint_reshard_tp_hybrid.py",
    "tests/runtime/test_checkpoint_multiprocess.py::test_export_from_tp2_is_the_hf_state_dict",
    "tests/runtime/test_checkpoint_multiprocess.py::"
    "test_meshtrain_export_gives_from_pretrained_the_trained_logits",
    # AWS's SMP v2 scripts, their quick case (tp 2 x hybrid 2: train, save, resume)
    "tests/runtime/compat/test_aws_smp_v2.py::test_aws_scripts_train_save_and_resume[2-1-folders0]",
    # every private torch API the runtime uses, and the SMP patches' torch signatures
    "tests/runtime/test_torch_api.py",
    "tests/runtime/test_mesh.py",
    "tests/runtime/compat/test_smp_units.py::test_patched_torch_signatures_are_the_checked_ones",
    # the libraries at their floors: datasets (the loader's sources), pydantic, boto3 + moto,
    # kubernetes
    "tests/runtime/test_data_sources.py",
    "tests/sdk/test_distribution.py",
    "tests/sdk/test_jobspec.py",
    "tests/sdk/backends/sagemaker/test_sagemaker_request.py",
    "tests/sdk/backends/kubernetes/test_render.py",
    "tests/sdk/backends/kubernetes/test_backend.py",
)


# ----------------------------------------------------------------------------- floors
REQUIREMENT = re.compile(r"^\s*([A-Za-z0-9][A-Za-z0-9._-]*)(\[[^\]]*\])?\s*([^;]*?)\s*(;.*)?$")


def declared_requirements(pyproject: Path = ROOT / "pyproject.toml") -> list[str]:
    """The requirement strings of the base dependencies and of `EXTRAS`."""
    project = tomllib.loads(pyproject.read_text())["project"]
    found = list(project["dependencies"])
    for extra in EXTRAS.split(","):
        found += project["optional-dependencies"][extra]
    return found


def floor_pins(requirements: list[str]) -> dict[str, str]:
    """name -> ``name==floor`` (with its marker) for every ``>=`` or ``==`` requirement."""
    pins: dict[str, str] = {}
    for line in requirements:
        match = REQUIREMENT.match(line)
        if match is None:
            raise SystemExit(f"FATAL: cannot read the requirement {line!r} in pyproject.toml")
        name, _extras, specifier, marker = match.groups()
        floor = re.search(r"(?:>=|==)\s*([0-9][^,\s]*)", specifier)
        if floor:
            key = name.lower().replace("_", "-")
            pins[key] = f"{name}=={floor.group(1)}{' ' + marker if marker else ''}"
    return pins


def install_arguments(environment: Environment) -> list[str]:
    """What `pip install` gets after torch: the project with `EXTRAS`, or with the dev
    extra's requirements listed one by one when some of them are left out."""
    if not environment.without:
        return ["-e", f".[{EXTRAS}]"]
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    kept = [r for r in project["optional-dependencies"]["dev"]
            if REQUIREMENT.match(r).group(1).lower() not in environment.without]
    extras = ",".join(e for e in EXTRAS.split(",") if e != "dev")
    return ["-e", f".[{extras}]", *kept]


def constraints(environment: Environment, extra_pins: list[str]) -> list[str]:
    """The constraint lines of `environment`: its floors, its pins, then `extra_pins`."""
    floors = floor_pins(declared_requirements())
    lines = []
    for name, pin in sorted(floors.items()):
        torch_side = name in TORCH_FLOOR_PACKAGES
        if name in environment.without:
            continue
        if ("torch" in environment.floors and torch_side) or (
                "libraries" in environment.floors and not torch_side):
            lines.append(pin)
    return lines + list(environment.pins) + extra_pins


def torch_version(environment: Environment) -> str:
    return environment.torch or floor_pins(declared_requirements())["torch"].split("==")[1]


# ----------------------------------------------------------------------------- one environment
class BuildError(Exception):
    """An environment could not be built (the tier fails)."""


def run(command: list[str], *, log: Path, env: dict[str, str] | None = None,
        what: str) -> None:
    """Run `command` with its output in `log` (written as it runs); on failure raise
    BuildError with the output's tail."""
    started = time.monotonic()
    with log.open("w") as out:
        code = subprocess.run(command, cwd=ROOT, env=env, stdout=out,
                              stderr=subprocess.STDOUT).returncode
    if code != 0:
        raise BuildError(f"{what} failed (exit {code}):\n{log.read_text()[-4000:]}")
    print(f"{what}: {time.monotonic() - started:.0f} s", flush=True)


def build(environment: Environment, venv: Path, extra_pins: list[str]) -> Path:
    """Create `venv` and install torch, then the project with its extras; return its python."""
    venv.mkdir(parents=True, exist_ok=True)
    run([sys.executable, "-m", "venv", str(venv)], log=venv.parent / f"{venv.name}-venv.log",
        what="python3 -m venv")
    python = venv / "bin" / "python"
    pip_env = {**os.environ, "PIP_DISABLE_PIP_VERSION_CHECK": "1",
               "PIP_ROOT_USER_ACTION": "ignore"}
    pinned = constraints(environment, extra_pins)
    constraint_file = venv / "constraints.txt"
    constraint_file.write_text("".join(f"{line}\n" for line in pinned))
    torch_pin = f"torch=={torch_version(environment)}"
    # A machine-wide constraints file may cap torch at what lies on its disk; this tier
    # installs the release it names, whatever the cap.
    run([str(python), "-m", "pip", "install", torch_pin], log=venv / "pip-torch.log",
        env={**pip_env, "PIP_CONSTRAINT": str(constraint_file)}, what=f"pip install {torch_pin}")
    project = install_arguments(environment)
    run([str(python), "-m", "pip", "install", torch_pin, *project],
        log=venv / "pip-project.log",
        env={**pip_env, "PIP_CONSTRAINT": str(constraint_file)},
        what=f"pip install {' '.join(project)} with {pinned}")
    return python


def installed_versions(python: Path) -> dict[str, str]:
    """Distribution -> version in the environment of `python` (missing ones: '-')."""
    script = ("import json, sys, importlib.metadata as m\n"
              "def v(n):\n    try: return m.version(n)\n    except m.PackageNotFoundError: "
              "return '-'\nprint(json.dumps({n: v(n) for n in sys.argv[1:]}))")
    result = subprocess.run([str(python), "-c", script, *SHOWN], capture_output=True,
                            text=True, check=True)
    return json.loads(result.stdout)


def run_subset(python: Path) -> int:
    """Run `SUBSET` in the environment; return pytest's exit code."""
    env = {**os.environ, "CI": "true", "PYTHONDONTWRITEBYTECODE": "1"}
    command = [str(python), "-m", "pytest", "-n", "auto", "--dist", "loadfile",
               "-p", "no:cacheprovider", *SUBSET]
    return subprocess.run(command, cwd=ROOT, env=env).returncode


# ----------------------------------------------------------------------------- the tier
@dataclass
class Outcome:
    name: str
    versions: dict[str, str]
    result: str
    install_s: float
    tests_s: float


def run_environment(environment: Environment, work: Path, extra_pins: list[str],
                    keep: bool) -> Outcome:
    print(f"\n== version tier: {environment.name}: {environment.why}", flush=True)
    venv = work / f"versions-{environment.name}"
    start = time.monotonic()
    try:
        python = build(environment, venv, extra_pins)
    except BuildError as error:
        print(f"FAILED to build {environment.name}: {error}", flush=True)
        return Outcome(environment.name, {}, "environment not built",
                       time.monotonic() - start, 0.0)
    installed = time.monotonic()
    versions = installed_versions(python)
    print("versions: " + ", ".join(f"{n} {v}" for n, v in versions.items()), flush=True)
    code = run_subset(python)
    outcome = Outcome(environment.name, versions, "passed" if code == 0 else f"failed ({code})",
                      installed - start, time.monotonic() - installed)
    if not keep:
        shutil.rmtree(venv, ignore_errors=True)
    return outcome


def summary(outcomes: list[Outcome]) -> str:
    lines = ["", "== version tier summary",
             f"{'environment':16} {'torch':14} {'transformers':13} {'install':>8} "
             f"{'tests':>8}  result"]
    for o in outcomes:
        lines.append(f"{o.name:16} {o.versions.get('torch', '-'):14} "
                     f"{o.versions.get('transformers', '-'):13} {o.install_s:7.0f}s "
                     f"{o.tests_s:7.0f}s  {o.result}")
    return "\n".join(lines)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    names = [e.name for e in ENVIRONMENTS]
    parser.add_argument("--only", action="append", choices=names, help="run this environment")
    parser.add_argument("--pin", action="append", default=[], metavar="ENV:REQUIREMENT",
                        help="add a constraint to one environment (e.g. to break it on purpose)")
    parser.add_argument("--work", type=Path, help="where the environments go (default: a "
                        "temporary folder, removed afterwards)")
    parser.add_argument("--keep", action="store_true", help="keep the environments")
    parser.add_argument("--json", type=Path, help="also write the outcomes to this file")
    parser.add_argument("--list", action="store_true", help="print the plan and exit")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    chosen = [e for e in ENVIRONMENTS if not args.only or e.name in args.only]
    pins: dict[str, list[str]] = {e.name: [] for e in ENVIRONMENTS}
    for item in args.pin:
        name, _, requirement = item.partition(":")
        if name not in pins or not requirement:
            raise SystemExit(f"--pin {item!r}: use ENV:REQUIREMENT with ENV one of {list(pins)}.")
        pins[name].append(requirement)
    if args.list:
        for e in chosen:
            print(f"{e.name}: torch=={torch_version(e)}, then {' '.join(install_arguments(e))}"
                  f"; constraints: {constraints(e, pins[e.name]) or 'none'}")
        print("\n".join(SUBSET))
        return 0
    work = args.work or Path(tempfile.mkdtemp(prefix="meshtrain-versions-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        outcomes = [run_environment(e, work, pins[e.name], args.keep) for e in chosen]
    finally:
        if args.work is None and not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(summary(outcomes), flush=True)
    if args.json:
        args.json.write_text(json.dumps([o.__dict__ for o in outcomes], indent=1) + "\n")
    return 0 if all(o.result == "passed" for o in outcomes) else 1


if __name__ == "__main__":
    sys.exit(main())
