"""What a host's fork server imports before it forks the ranks (host/fork_server.py).

Every rank of a meshtrain job imports the rank wrapper, torch's distributed packages and the
runtime's layouts. Beyond those, what a script takes from a few libraries that are costly to
import and safe to fork after (no threads, no CUDA at import) is found by reading its source and
that of the modules of its own folder it imports, never by running it: ``import x``,
``from x import y`` and ``x.y`` where ``x`` is such a library. A preload that fails is left to
the rank, which imports it again and reports what went wrong.
"""

from __future__ import annotations

import ast
import contextlib
import importlib
import os
from collections.abc import Iterator
from pathlib import Path

from meshtrain.contract.env import MESHTRAIN_RANK_PRELOAD
from meshtrain_runtime.compat import ALIAS, TARGET

# what every rank imports before its script (torchrun's wrapper, rank_entry's): the rest is
# what the script takes, so a plain torch script does not pay for the runtime's layouts
RANK_MODULES = (
    "torch", "torch.distributed", "torch.distributed.run", "meshtrain_runtime.host.rank_entry",
    "meshtrain_runtime.compat", "meshtrain_runtime.host.watchdog", "meshtrain_runtime.stopping",
)
# libraries whose import is worth doing once and is safe to fork after: no threads, no CUDA
FORK_SAFE_LIBRARIES = frozenset({"torch", "transformers", "numpy", "meshtrain_runtime"})
# transformers' imports are lazy: its cost is in the model code, loaded on first use
HEAVY_PARTS = {"transformers": "transformers.modeling_utils"}


def preload_modules(script: Path) -> list[str]:
    """What the fork server imports for `script`: every rank's modules, and what the script (or
    a module of its own folder it imports) takes from fork-safe libraries, found by reading its
    source, never by running it. ``module:name`` entries are names taken from a module (a lazy
    package such as meshtrain_runtime or transformers loads their code on first use)."""
    found = list(RANK_MODULES)
    for entry in map(_real_name, _imports(script, set())):
        top = entry.partition(":")[0].split(".")[0]
        if top in FORK_SAFE_LIBRARIES:
            found += [part for part in (HEAVY_PARTS.get(top), entry) if part]
    return list(dict.fromkeys(found))


def _real_name(entry: str) -> str:
    """``torch.sagemaker`` (an SMP v2 script's import) as the module the rank's alias loads."""
    if entry == ALIAS or entry.startswith((f"{ALIAS}.", f"{ALIAS}:")):
        return TARGET + entry[len(ALIAS):]
    return entry


def _imports(script: Path, seen: set[Path]) -> Iterator[str]:
    """`script`'s imports and the names it uses from them (``module`` or ``module:name``), and
    those of the modules of its own folder that it imports."""
    if script in seen or not script.is_file():
        return
    seen.add(script)
    try:
        tree = ast.parse(script.read_text(encoding="utf-8", errors="replace"))
    except (SyntaxError, ValueError, OSError):
        return  # the rank reports a broken script itself
    aliases: dict[str, str] = {}  # a name `import` binds in the script -> its module
    imported: set[str] = set()  # top-level names of every module imported
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield alias.name
                top = alias.name.split(".")[0]
                aliases[alias.asname or top] = alias.name if alias.asname else top
                imported.add(top)
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            yield node.module
            yield from (f"{node.module}:{alias.name}" for alias in node.names)
            imported.add(node.module.split(".")[0])
    for node in ast.walk(tree):  # `mt.forward_backward`: the name a lazy package loads
        if (isinstance(node, ast.Attribute) and isinstance(node.value, ast.Name)
                and node.value.id in aliases):
            yield f"{aliases[node.value.id]}:{node.attr}"
    for module in sorted(imported):
        yield from _imports(script.parent / f"{module}.py", seen)


def preload() -> None:
    """Import what MESHTRAIN_RANK_PRELOAD lists. A module that fails to import is left to the
    rank, which imports it again and reports what went wrong."""
    from meshtrain_runtime.host.import_noise import quiet_torchao_import

    quiet_torchao_import()  # transformers imports torchao: the ranks' filter, set before it
    for entry in filter(None, os.environ.get(MESHTRAIN_RANK_PRELOAD, "").split(",")):
        module, _, name = entry.partition(":")
        with contextlib.suppress(Exception):
            loaded = importlib.import_module(module)
            if name:
                getattr(loaded, name)  # a lazy module's attribute loads its code
