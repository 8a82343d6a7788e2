"""The house's one join, enforced: the runtime reaches the client only through
`meshtrain.contract`, and the client never imports torch or the runtime (design.md)."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in `source`, including lazy ones in functions."""
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            # `from meshtrain import contract` is judged by what it names, not its package.
            if node.module != "meshtrain":
                yield node.lineno, node.module
            for alias in node.names:
                yield node.lineno, f"{node.module}.{alias.name}"


def _within(module: str, package: str) -> bool:
    return module == package or module.startswith(package + ".")


def runtime_violations(source: str) -> list[str]:
    """Imports of the client other than its contract."""
    return sorted({f"line {line}: {module}" for line, module in imported_modules(source)
                   if _within(module, "meshtrain") and not _within(module, "meshtrain.contract")})


def client_violations(source: str) -> list[str]:
    """Imports of torch or of the runtime."""
    return sorted({f"line {line}: {module}" for line, module in imported_modules(source)
                   if _within(module, "torch") or _within(module, "meshtrain_runtime")})


def _violations_in(folder: str, check) -> dict[str, list[str]]:
    out = {}
    for path in sorted((ROOT / folder).rglob("*.py")):
        found = check(path.read_text())
        if found:
            out[str(path.relative_to(ROOT))] = found
    return out


def test_the_runtime_imports_only_the_contract_from_the_client():
    assert _violations_in("runtime", runtime_violations) == {}


def test_the_client_never_imports_torch_or_the_runtime():
    assert _violations_in("sdk", client_violations) == {}


@pytest.mark.parametrize("source", [
    "from meshtrain.errors import ConfigError",
    "import meshtrain.estimator",
    "from meshtrain import Estimator",
    "def f():\n    from meshtrain.backends.local import LocalBackend\n",
])
def test_the_runtime_check_catches_a_violating_import(source):
    assert runtime_violations(source)


@pytest.mark.parametrize("source", [
    "from meshtrain.contract import ConfigError",
    "import meshtrain.contract.metrics as m",
    "from meshtrain.contract.metrics import format_metric_line",
    "import meshtrain_runtime.state",
    "from meshtrain import contract",
])
def test_the_runtime_check_allows_the_contract(source):
    assert runtime_violations(source) == []


@pytest.mark.parametrize("source", [
    "import torch", "from torch.distributed import init_process_group",
    "def f():\n    import torch.nn\n", "from meshtrain_runtime import init",
])
def test_the_client_check_catches_torch_and_the_runtime(source):
    assert client_violations(source)
