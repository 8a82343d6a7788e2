"""``python lighthouse_entry.py ARGS``: torchft's lighthouse, started fast.

torchft's own ``torchft_lighthouse`` command calls ``torchft._torchft.lighthouse_main`` after
importing the ``torchft`` package, whose ``__init__`` imports torch: 5-10 s on a loaded host
before the lighthouse even binds. The lighthouse itself is the compiled extension alone, so this
entry loads that one file (the same function the command calls, the same arguments) and no torch.
It runs as a script path, not with -m: the lighthouse parses the process's argv after argv[0].
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import sys
from pathlib import Path

EXTENSION = "torchft._torchft"


def load_extension() -> object:
    """torchft's compiled extension module, without running torchft/__init__.py."""
    package = importlib.util.find_spec("torchft")
    if package is None or not package.submodule_search_locations:
        raise SystemExit("meshtrain: torchft is not installed (pip install 'torchft==0.2.0')")
    folder = Path(next(iter(package.submodule_search_locations)))
    found = sorted(folder.glob("_torchft*.so"))
    if not found:
        raise SystemExit(f"meshtrain: no torchft extension (_torchft*.so) in {folder}")
    loader = importlib.machinery.ExtensionFileLoader(EXTENSION, str(found[0]))
    spec = importlib.util.spec_from_file_location(EXTENSION, found[0], loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def main() -> None:
    module = load_extension()
    sys.argv[0] = "torchft_lighthouse"
    sys.exit(module.lighthouse_main())


if __name__ == "__main__":
    main()
