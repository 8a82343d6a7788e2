"""Guard: only runtime/meshtrain_runtime/mesh.py constructs DeviceMeshes (sdk/ and runtime/).

One object owns the mesh (design.md): every other module gets views of the world mesh that
``meshtrain_runtime.mesh`` builds. A construction is any use of ``init_device_mesh`` (import or
call), a ``DeviceMesh(...)`` call, or ``DeviceMesh.from_group``; names inside comments and strings
(docstrings, messages) are not code and do not count.
"""

from __future__ import annotations

import io
import tokenize
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
OWNER = ROOT / "runtime" / "meshtrain_runtime" / "mesh.py"


def mesh_constructions(source: str) -> list[tuple[int, str]]:
    """(line, what) of every DeviceMesh construction in `source`, outside comments/strings."""
    tokens = [t for t in tokenize.generate_tokens(io.StringIO(source).readline)
              if t.type in (tokenize.NAME, tokenize.OP)]
    found = []
    for index, token in enumerate(tokens):
        following = [t.string for t in tokens[index + 1:index + 3]]
        if token.string == "init_device_mesh":
            found.append((token.start[0], "init_device_mesh"))
        elif token.string == "DeviceMesh" and following[:1] == ["("]:
            found.append((token.start[0], "DeviceMesh("))
        elif token.string == "DeviceMesh" and following == [".", "from_group"]:
            found.append((token.start[0], "DeviceMesh.from_group"))
    return found


def test_only_mesh_py_constructs_device_meshes() -> None:
    files = sorted([*(ROOT / "sdk").rglob("*.py"), *(ROOT / "runtime").rglob("*.py")])
    assert len(files) > 100
    violations = [
        f"{path.relative_to(ROOT)}:{line}: {what}"
        for path in files if path != OWNER
        for line, what in mesh_constructions(path.read_text())
    ]
    assert not violations, (
        "build meshes in runtime/meshtrain_runtime/mesh.py and pass views:\n"
        + "\n".join(violations)
    )
    owned = {what for _, what in mesh_constructions(OWNER.read_text())}
    assert owned == {"init_device_mesh", "DeviceMesh.from_group"}  # the guard sees the owner


def test_the_guard_catches_a_violation() -> None:
    violating = '''
"""A docstring may name init_device_mesh and DeviceMesh(...)."""
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
mesh = init_device_mesh("cpu", (4,))  # a comment: DeviceMesh("cpu", [0])
other = DeviceMesh("cpu", [0, 1])
third = DeviceMesh.from_group(group, "cpu")
message = f"no DeviceMesh( here {mesh}"
def f(mesh: DeviceMesh) -> DeviceMesh:
    return mesh["tp"]
'''
    assert mesh_constructions(violating) == [
        (3, "init_device_mesh"), (4, "init_device_mesh"), (5, "DeviceMesh("),
        (6, "DeviceMesh.from_group"),
    ]
