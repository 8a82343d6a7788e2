"""Guard: the runtime names mesh axes with ``MeshAxis``, never with string literals.

Every string constant in ``runtime/meshtrain_runtime`` that equals an axis name is a violation,
except docstrings, text inside f-strings (messages) and the allow-listed uses below, which are
not mesh axes.
"""

from __future__ import annotations

import ast
from pathlib import Path

from meshtrain.contract.mesh_axes import MeshAxis

RUNTIME = Path(__file__).resolve().parents[2] / "runtime" / "meshtrain_runtime"
AXIS_NAMES = frozenset(axis.value for axis in MeshAxis)

# (file under meshtrain_runtime, literal): why it is not a mesh axis.
ALLOWED = {
    ("parallel/plans/resolve.py", "replicate"): "a tensor-parallel style name",
    ("parallel/plans/styles.py", "replicate"): "a tensor-parallel style name",
    ("parallel/plans/regions.py", "replicate"): "a tensor-parallel style name",
    ("fault/records.py", "replica"): "a records file's kind (replica-<g>.jsonl), not an axis",
}


def axis_literals(source: str) -> list[tuple[int, str]]:
    """(line, literal) of every string constant in `source` that equals a mesh-axis name,
    outside docstrings and f-strings."""
    tree = ast.parse(source)
    skipped: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            skipped.update(id(value) for value in node.values)
        body = getattr(node, "body", None)
        if isinstance(body, list) and body and isinstance(body[0], ast.Expr):
            skipped.add(id(body[0].value))  # a docstring (or a bare string statement)
    return sorted(
        (node.lineno, node.value)
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str)
        and node.value in AXIS_NAMES and id(node) not in skipped
    )


def test_no_runtime_file_names_a_mesh_axis_with_a_literal() -> None:
    files = sorted(RUNTIME.rglob("*.py"))
    assert len(files) > 30
    found = [
        f"{path.relative_to(RUNTIME)}:{line}: {value!r}"
        for path in files
        for line, value in axis_literals(path.read_text())
        if (path.relative_to(RUNTIME).as_posix(), value) not in ALLOWED
    ]
    assert not found, "use meshtrain.contract.mesh_axes.MeshAxis instead of:\n" + "\n".join(found)


def test_allowed_literals_are_still_there() -> None:
    for (relative, value), _why in ALLOWED.items():
        assert (value in {v for _, v in axis_literals((RUNTIME / relative).read_text())}), relative


def test_the_guard_catches_literal_axis_names() -> None:
    violating = '''
"""Module docstring naming tp and shard is fine."""
def f(mesh, tensor):
    """So is a function docstring: 'ep'."""
    names = mesh.mesh_dim_names
    if "tp" in names:
        return mesh["replicate", "shard"], names.index("tp")
    raise ValueError(f"no 'tp' axis in {names}")
group = mesh.get_group("ep")
mesh = init_device_mesh("cpu", (2,), mesh_dim_names=("dp",))
'''
    assert axis_literals(violating) == [
        (6, "tp"), (7, "replicate"), (7, "shard"), (7, "tp"), (9, "ep"), (10, "dp"),
    ]
    clean = "def f(mesh):\n    return mesh[MeshAxis.TP], mesh.get_group(MeshAxis.EP)\n"
    assert axis_literals(clean) == []
