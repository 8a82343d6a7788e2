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


def module_names(roots: dict[str, Path]) -> dict[str, Path]:
    """Dotted module name -> file, for every module under each source root (a package is its
    __init__.py)."""
    modules = {}
    for root in roots.values():
        for path in sorted(root.rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def imported_targets(source: str, module: str, is_package: bool,
                     modules: set[str]) -> set[str]:
    """The modules of `modules` that `source` (module `module`) imports, anywhere in it (lazy
    and TYPE_CHECKING imports too). ``from pkg import name`` is the submodule pkg.name when one
    exists, else pkg itself; relative imports are resolved."""
    package = module if is_package else module.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(source)):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                parts = package.split(".")[:len(package.split(".")) - node.level + 1]
                base = ".".join(parts + ([base] if base else []))
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                     for alias in node.names]
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def import_graph(roots: dict[str, Path]) -> dict[str, set[str]]:
    """module -> the modules it imports, over every module under `roots`."""
    modules = module_names(roots)
    return {name: imported_targets(path.read_text(), name, path.name == "__init__.py",
                                   set(modules))
            for name, path in modules.items()}


SOURCE_ROOTS = {"sdk": ROOT / "sdk", "runtime": ROOT / "runtime"}


def import_cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One cycle of `graph` (its modules, the first repeated at the end), or None."""
    try:
        tuple(graphlib.TopologicalSorter(graph).static_order())
    except graphlib.CycleError as error:
        return error.args[1]
    return None


def test_plan_modules_import_each_other_only_at_their_top():
    folder = ROOT / "sdk" / "meshtrain" / "plan"
    found = {path.name: lazy_plan_imports(path.read_text()) for path in folder.glob("*.py")}
    assert {name: lazy for name, lazy in found.items() if lazy} == {}


def test_no_module_of_sdk_or_runtime_is_in_an_import_cycle():
    graph = import_graph(SOURCE_ROOTS)
    assert "meshtrain.plan.spec" in graph["meshtrain.plan.encdec"]  # the graph sees imports
    assert "meshtrain_runtime.fault" in graph["meshtrain_runtime.state"]
    assert len(graph) == len(list(ROOT.glob("sdk/**/*.py")) + list(ROOT.glob("runtime/**/*.py")))
    assert import_cycle(graph) is None


@pytest.mark.parametrize(("files", "cycle"), [
    ({"pkg/__init__.py": "", "pkg/a.py": "from pkg import b\n", "pkg/b.py": "import pkg.a\n"},
     ["pkg.a", "pkg.b"]),
    ({"pkg/__init__.py": "", "pkg/a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
      "    from pkg.b import B\n", "pkg/b.py": "def f():\n    from .a import A\n"},
     ["pkg.a", "pkg.b"]),
    ({"pkg/__init__.py": "from pkg.a import A\n", "pkg/a.py": "from pkg import b\n",
      "pkg/b.py": "X = 1\n"}, None),
])
def test_the_cycle_check_catches_top_lazy_and_type_checking_cycles(tmp_path, files, cycle):
    for name, text in files.items():
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text(text)
    found = import_cycle(import_graph({"src": tmp_path}))
    assert (sorted(set(found)) if found else None) == cycle


@pytest.mark.parametrize(("source", "lazy"), [
    ("def f():\n    from meshtrain.plan.encdec import t5_groups\n", True),
    ("def f():\n    if x:\n        import meshtrain.plan.models\n", True),
    ("from meshtrain.plan.spec import ModelShape\n", False),
    ("def f():\n    import matplotlib\n", False),
])
def test_the_lazy_import_check_catches_a_function_level_plan_import(source, lazy):
    assert bool(lazy_plan_imports(source)) is lazy


BACKENDS = ROOT / "sdk" / "meshtrain" / "backends"
SHARED_LAYERS = {"hosts"}
"""Folders under backends/ that backends compose (not backends themselves)."""


def backend_packages() -> list[str]:
    return sorted(path.name for path in BACKENDS.iterdir()
                  if path.is_dir() and (path / "__init__.py").exists()
                  and path.name not in SHARED_LAYERS)


def cross_backend_imports(source: str, own: str, backends: list[str]) -> list[str]:
    """Imports of another backend's package, of the planner, or of `meshtrain` itself (its
    __init__, a floor above every backend) from inside backend `own`."""
    found = set()
    tree = ast.parse(source)
    for node in ast.walk(tree):
        bare = isinstance(node, ast.Import) and any(a.name == "meshtrain" for a in node.names)
        top = (isinstance(node, ast.ImportFrom) and node.level == 0 and node.module == "meshtrain"
               and any(alias.name.startswith("__") for alias in node.names))
        if bare or top:
            found.add(f"line {node.lineno}: meshtrain")
    for line, module in _imports_in(tree):
        others = [b for b in backends if b != own and _within(module, f"meshtrain.backends.{b}")]
        if others or _within(module, PLAN):
            found.add(f"line {line}: {module}")
    return sorted(found)


def test_no_backend_imports_another_backend_the_planner_or_meshtrain_itself():
    backends = backend_packages()
    assert {"local", "docker", "sagemaker", "kubernetes"} <= set(backends)
    found = {}
    for own in backends:
        for path in sorted((BACKENDS / own).rglob("*.py")):
            hits = cross_backend_imports(path.read_text(), own, backends)
            if hits:
                found[str(path.relative_to(ROOT))] = hits
    for path in sorted((BACKENDS / "hosts").rglob("*.py")):  # the shared layer: no backend
        hits = cross_backend_imports(path.read_text(), "hosts", backends)
        if hits:
            found[str(path.relative_to(ROOT))] = hits
    assert found == {}


@pytest.mark.parametrize(("source", "own", "caught"), [
    ("from meshtrain.backends.local.backend import LocalBackend\n", "docker", True),
    ("def f():\n    from meshtrain.backends.sagemaker.checks import parse_s3_uri\n", "local", True),
    ("import meshtrain.backends.docker.engine\n", "kubernetes", True),
    ("import meshtrain\n", "docker", True),
    ("from meshtrain import __version__\n", "sagemaker", True),
    ("from meshtrain.plan.instances import gpus_per_instance\n", "sagemaker", True),
    ("from meshtrain.backends.hosts.layout import JobDirectory\n", "docker", False),
    ("from meshtrain.backends.docker.volumes import OPTIONS\n", "docker", False),
    ("from meshtrain.backends.s3_uri import parse_s3_uri\n", "sagemaker", False),
    ("from meshtrain.version import __version__\n", "docker", False),
])
def test_the_backend_check_catches_a_cross_backend_import(source, own, caught):
    assert bool(cross_backend_imports(source, own, ["docker", "kubernetes", "local",
                                                     "sagemaker"])) is caught


INSTANCE_TYPE_READERS = {"sdk/meshtrain/targets.py", "sdk/meshtrain/instances.py"}
PREFIXES = {"ml.", "k8s:"}


def _names_instance_type(node: ast.AST) -> bool:
    return ((isinstance(node, ast.Name) and node.id == "instance_type")
            or (isinstance(node, ast.Attribute) and node.attr == "instance_type"))


def instance_type_parsing(source: str) -> list[str]:
    """Where `source` reads an instance type string: a method called on it (startswith, split,
    removeprefix, ...), an index or slice of it, a comparison of it with a string literal or an
    `in` test on it, a regex applied to it, or an "ml." / "k8s:" prefix literal."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        line = getattr(node, "lineno", 0)
        if isinstance(node, ast.Attribute) and _names_instance_type(node.value):
            found.add(f"line {line}: .{node.attr} of instance_type")
        elif isinstance(node, ast.Subscript) and _names_instance_type(node.value):
            found.add(f"line {line}: instance_type[...]")
        elif isinstance(node, ast.Compare):
            sides = [node.left, *node.comparators]
            strings = any(isinstance(s, ast.Constant) and isinstance(s.value, str)
                          for s in sides)
            membership = any(isinstance(op, ast.In | ast.NotIn) for op in node.ops)
            if any(_names_instance_type(s) for s in sides) and (strings or membership):
                found.add(f"line {line}: a comparison of instance_type")
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
              and isinstance(node.func.value, ast.Name) and node.func.value.id == "re"
              and any(_names_instance_type(arg) for arg in node.args)):
            found.add(f"line {line}: a regex on instance_type")
        elif isinstance(node, ast.Constant) and node.value in PREFIXES:
            found.add(f"line {line}: the prefix literal {node.value!r}")
    return sorted(found)


def test_instance_type_is_read_only_by_the_targets_and_the_instance_table():
    found = {}
    for path in sorted((ROOT / "sdk").rglob("*.py")):
        name = str(path.relative_to(ROOT))
        hits = instance_type_parsing(path.read_text())
        if hits and name not in INSTANCE_TYPE_READERS:
            found[name] = hits
    assert found == {}
    assert instance_type_parsing((ROOT / "sdk/meshtrain/targets.py").read_text())  # it parses


@pytest.mark.parametrize(("source", "caught"), [
    ("family = instance_type.split('.')[1]\n", True),
    ("if spec.instance_type.startswith('ml.'):\n    pass\n", True),
    ("gpu = spec.instance_type == 'local_gpu'\n", True),
    ("p5 = 'p5' in instance_type\n", True),
    ("node = target.instance_type.removeprefix(PREFIX)\n", True),
    ("family = instance_type[3:6]\n", True),
    ("m = re.fullmatch(PATTERN, instance_type)\n", True),
    ("PREFIX = 'k8s:'\n", True),
    ("target = resolve_target(spec.instance_type)\n", False),
    ("resources = {'InstanceType': spec.instance_type}\n", False),
    ("message = f'{spec.instance_count} x {spec.instance_type}'\n", False),
])
def test_the_instance_type_check_catches_a_parse(source, caught):
    assert bool(instance_type_parsing(source)) is caught
