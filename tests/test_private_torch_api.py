"""Guard: only runtime/meshtrain_runtime/torch_api.py names a private torch API.

Private means an underscore name inside torch: a module (``torch.distributed._functional_
collectives``), an imported name (``_Policy``), an attribute reached from ``torch``
(``torch._C._current_graph_task_id``, ``torch.ops.aten._scaled_dot_product_...``), or one of
the private attributes of torch objects the runtime has used (``mesh._unflatten``,
``module._handle`` ...: `PRIVATE_ATTRIBUTES`). Every such use goes through torch_api, which
tests/runtime/test_torch_api.py checks on each torch CI tests. ``nn.Module``'s registration
dicts (``_parameters``, ``_buffers``, ``_modules``) are allowed (see torch_api's docstring), and
so is a class's own attribute that happens to share a listed name (``self._base``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
RUNTIME = ROOT / "runtime" / "meshtrain_runtime"
OWNER = RUNTIME / "torch_api.py"
PRIVATE_ATTRIBUTES = frozenset({
    "_unflatten", "_flatten", "_get_fsdp_state", "_fsdp_param_group", "_unsharded_param",
    "_handle", "_use_orig_params", "_sync_gradients", "_params", "_shapes", "_numels",
    "_shard_param_infos", "_param_extensions", "_numels_with_padding", "_is_padding_mask",
    "_module_classes", "_local_tensor", "_base", "_compiled_call_impl", "_execution_engine",
    "_overloadpacket", "_get_default_group", "_current_graph_task_id", "_get_root_mesh",
    "_mesh_resources", "_dim_group_names", "_pg_registry", "_flatten_mapping",
})


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _dotted(node: ast.AST) -> list[str] | None:
    """``torch.a.b`` -> ["torch", "a", "b"]; None when the chain does not start at a name."""
    parts: list[str] = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if isinstance(node, ast.Name):
        return [node.id, *reversed(parts)]
    return None


def private_torch_uses(source: str) -> list[tuple[int, str]]:
    """(line, what) of every private torch API named in `source`."""
    found: list[tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "torch":
            names = [node.module, *(f"{node.module}.{a.name}" for a in node.names)]
            found += [(node.lineno, name) for name in names
                      if any(_private(part) for part in name.split("."))][:1]
        elif isinstance(node, ast.Import):
            found += [(node.lineno, a.name) for a in node.names
                      if a.name.split(".")[0] == "torch"
                      and any(_private(part) for part in a.name.split("."))]
        elif isinstance(node, ast.Attribute):
            chain = _dotted(node)
            if chain and chain[0] == "torch" and _private(node.attr):
                found.append((node.lineno, ".".join(chain)))
            elif node.attr in PRIVATE_ATTRIBUTES and chain != ["self", node.attr]:
                found.append((node.lineno, f"._{node.attr.lstrip('_')}"))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in {"getattr", "hasattr", "setattr"} and len(node.args) > 1
              and isinstance(node.args[1], ast.Constant)
              and node.args[1].value in PRIVATE_ATTRIBUTES):
            found.append((node.lineno, f"{node.func.id}(..., {node.args[1].value!r})"))
    return found


def test_only_torch_api_names_private_torch_apis() -> None:
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) > 50 and OWNER in files
    violations = [f"{path.relative_to(ROOT)}:{line}: {what}"
                  for path in files if path != OWNER
                  for line, what in private_torch_uses(path.read_text())]
    assert not violations, (
        "call a function of meshtrain_runtime.torch_api (add one, with its test in "
        "tests/runtime/test_torch_api.py) instead of a private torch API:\n"
        + "\n".join(violations))
    assert len(private_torch_uses(OWNER.read_text())) > 10  # the guard sees the owner's


@pytest.mark.parametrize("source", [
    "from torch.distributed import _functional_collectives as funcol",
    "from torch.distributed.fsdp.wrap import ModuleWrapPolicy, _Policy",
    "import torch.distributed._functional_collectives",
    "import torch\nx = torch._C._current_graph_task_id()",
    "import torch\nop = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu",
    "layout = world._unflatten(0, (2, 2), ('a', 'b'))",
    "handle = unit._handle",
    "flag = getattr(root, '_sync_gradients', True)",
])
def test_the_guard_catches_a_private_use(source: str) -> None:
    assert private_torch_uses(source), source


@pytest.mark.parametrize("source", [
    "import torch\nversion = torch.__version__",
    "from torch.distributed.fsdp import FullyShardedDataParallel",
    "module._parameters[name] = param",
    "self._base(**given).last_hidden_state",  # a class's own attribute of that name
    "from meshtrain_runtime import torch_api\nmesh = torch_api.flatten_mesh(ep_mesh)",
])
def test_the_guard_allows_public_names(source: str) -> None:
    assert private_torch_uses(source) == []
