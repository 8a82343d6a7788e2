"""The house's one join, enforced: the runtime reaches the client only through
`meshtrain.contract`, and the client never imports torch or the runtime (design.md)."""

from __future__ import annotations

import ast
import graphlib
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def imported_modules(source: str) -> Iterator[tuple[int, str]]:
    """(line, module) for every absolute import in `source`, including lazy ones in functions."""
    return _imports_in(ast.parse(source))


def _imports_in(tree: ast.AST) -> Iterator[tuple[int, str]]:
    for node in ast.walk(tree):
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


PLAN = "meshtrain.plan"


def lazy_plan_imports(source: str) -> list[str]:
    """Imports of a meshtrain.plan module made inside a function body: a cycle hidden from the
    module's top (models <-> encdec was one)."""
    return sorted({f"line {line}: {module}"
                   for node in ast.walk(ast.parse(source))
                   if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
                   for line, module in _imports_in(node) if _within(module, PLAN)})


def plan_import_graph() -> dict[str, set[str]]:
    """meshtrain.plan module -> the plan modules it imports (anywhere in its source, under
    TYPE_CHECKING too)."""
    folder = ROOT / "sdk" / "meshtrain" / "plan"
    modules = {f"{PLAN}.{path.stem}": path for path in folder.glob("*.py")
               if path.stem != "__init__"}
    graph = {}
    for name, path in modules.items():
        imported = {module for _, module in imported_modules(path.read_text())}
        graph[name] = {other for other in modules if other != name and other in imported}
    return graph


def test_plan_modules_import_each_other_only_at_their_top():
    folder = ROOT / "sdk" / "meshtrain" / "plan"
    found = {path.name: lazy_plan_imports(path.read_text()) for path in folder.glob("*.py")}
    assert {name: lazy for name, lazy in found.items() if lazy} == {}


def test_the_plan_modules_import_graph_has_no_cycle():
    graph = plan_import_graph()
    assert f"{PLAN}.encdec" in graph and f"{PLAN}.spec" in graph[f"{PLAN}.encdec"]
    tuple(graphlib.TopologicalSorter(graph).static_order())  # raises CycleError on a cycle


@pytest.mark.parametrize(("source", "lazy"), [
    ("def f():\n    from meshtrain.plan.encdec import t5_groups\n", True),
    ("def f():\n    if x:\n        import meshtrain.plan.models\n", True),
    ("from meshtrain.plan.spec import ModelShape\n", False),
    ("def f():\n    import matplotlib\n", False),
])
def test_the_lazy_import_check_catches_a_function_level_plan_import(source, lazy):
    assert bool(lazy_plan_imports(source)) is lazy
