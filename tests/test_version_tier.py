"""CI's version tier (.ci/versions.py): its subset names real tests, its floors are pyproject's,
and docs/compatibility.md shows what its environments install.

No environment is built here (that is the tier's own run in .ci/run, minutes per environment).
"""

from __future__ import annotations

import ast
import importlib.util
import re
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "compatibility.md"


def _tier():
    spec = importlib.util.spec_from_file_location("ci_versions", ROOT / ".ci" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_versions"] = module
    spec.loader.exec_module(module)
    return module


tier = _tier()


def _functions(path: Path) -> set[str]:
    tree = ast.parse(path.read_text())
    return {node.name for node in ast.walk(tree)
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")}


@pytest.mark.parametrize("node_id", tier.SUBSET)
def test_every_subset_entry_names_a_test_that_exists(node_id: str) -> None:
    path, _, rest = node_id.partition("::")
    assert (ROOT / path).is_file(), path
    if rest:
        assert rest.split("[")[0] in _functions(ROOT / path), node_id


def test_the_subset_covers_what_the_tier_promises() -> None:
    joined = " ".join(tier.SUBSET)
    for topic in ("hsdp", "tensor_parallel", "pipeline", "context_parallel", "expert_parallel",
                  "expert_parallel_tp", "reshard", "export", "aws_smp_v2", "torch_api"):
        assert topic in joined, topic


def test_floors_come_from_pyproject() -> None:
    pins = tier.floor_pins([
        "torch>=2.10.0", "moto[server]>=5.2.5", "kubernetes>=29,<37",
        "torchft==0.2.0; sys_platform == 'linux'", "rich"])
    assert pins == {"torch": "torch==2.10.0", "moto": "moto==5.2.5",
                    "kubernetes": "kubernetes==29",
                    "torchft": "torchft==0.2.0 ; sys_platform == 'linux'"}
    declared = tier.floor_pins(tier.declared_requirements())
    by_name = {e.name: e for e in tier.ENVIRONMENTS}
    floors = tier.constraints(by_name["floors"], [])
    assert tier.torch_version(by_name["floors"]) == declared["torch"].split("==")[1]
    for name in ("torch", "torchao", "transformers", "numpy", "pydantic", "boto3", "kubernetes",
                 "pytest"):
        assert declared[name] in floors, name
    assert not any(line.startswith("sagemaker==") for line in floors)  # left out, with why
    assert tier.constraints(by_name["newest"], []) == []


def test_a_pin_breaks_one_environment_only() -> None:
    by_name = {e.name: e for e in tier.ENVIRONMENTS}
    assert tier.constraints(by_name["newest"], ["transformers==5.23.0"]) == [
        "transformers==5.23.0"]
    assert tier.main(["--list", "--pin", "newest:transformers==5.23.0"]) == 0
    with pytest.raises(SystemExit, match="ENV:REQUIREMENT"):
        tier.main(["--list", "--pin", "nowhere:transformers==5.23.0"])


def _table_rows() -> dict[str, list[str]]:
    rows = {}
    for line in DOC.read_text().splitlines():
        cells = [c.strip().strip("`") for c in line.strip().strip("|").split("|")]
        if line.startswith("|") and cells[0] in {e.name for e in tier.ENVIRONMENTS}:
            rows[cells[0]] = cells
    return rows


def test_the_compatibility_table_shows_what_each_environment_pins() -> None:
    rows = _table_rows()
    assert set(rows) == {e.name for e in tier.ENVIRONMENTS}
    assert re.search(r"[Mm]easured on \d{4}-\d{2}-\d{2}", DOC.read_text())
    test_only = _test_only_packages()
    text = DOC.read_text()
    for environment in tier.ENVIRONMENTS:
        row = " ".join(rows[environment.name])
        assert f"torch {tier.torch_version(environment)}" in row, environment.name
        for pin in tier.constraints(environment, []):
            requirement = pin.split(";")[0].strip()
            if "==" not in requirement:  # a bound, not a floor (pyarrow<26): shown as written
                assert re.sub(r"(<=|>=|<|>|!=)", r" \1 ", requirement) in row, pin
                continue
            name, version = requirement.split("==")
            where = text if name in test_only else row  # test tools: listed below the table
            assert re.search(rf"\b{re.escape(name)} {re.escape(version)}\b", where), pin


def _test_only_packages() -> set[str]:
    """Packages only the dev and notebooks extras name."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    user = [*project["dependencies"], *(r for name, reqs in extras.items()
                                        if name not in {"dev", "notebooks"} for r in reqs)]
    test = [r for name in ("dev", "notebooks") for r in extras[name]]
    names = {tier.REQUIREMENT.match(r).group(1) for r in test}
    return names - {tier.REQUIREMENT.match(r).group(1) for r in user}
