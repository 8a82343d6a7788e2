"""docs/planner.md's examples are the CLI's output: regenerated from the code, kept in step.

Each example in the page follows a marker line::

    <!-- generated: ARGS -->            the table output of `meshtrain plan ARGS`, 100 columns
    <!-- generated-json: ARGS :: PATH -->  the JSON value at PATH (dotted) of `--json` output

and is the fenced block right after it. `python tests/sdk/test_plan_docs.py` rewrites them.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
import shlex
import sys
from pathlib import Path

from meshtrain.plan.cli import plan_main

PAGE = Path(__file__).resolve().parents[2] / "docs" / "planner.md"
WIDTH = "100"
_BLOCK = re.compile(r"(<!-- (generated|generated-json): (.+?) -->\n)```(\w+)\n(.*?)```",
                    re.DOTALL)


def _run(argv: list[str]) -> str:
    out = io.StringIO()
    previous = os.environ.get("COLUMNS")
    os.environ["COLUMNS"] = WIDTH  # rich sizes its tables from it when not on a terminal
    try:
        with contextlib.redirect_stdout(out):
            plan_main(argv)
    finally:
        if previous is None:
            del os.environ["COLUMNS"]
        else:
            os.environ["COLUMNS"] = previous
    return out.getvalue()


def render(kind: str, spec: str) -> str:
    """The block's body for one marker."""
    if kind == "generated":
        lines = [line.rstrip() for line in _run(shlex.split(spec)).splitlines()]
        return f"$ meshtrain plan {spec}\n" + "\n".join(lines) + "\n"
    args, path = (part.strip() for part in spec.split("::"))
    value = json.loads(_run([*shlex.split(args), "--json"]))
    for key in path.split("."):
        value = value[key]
    return json.dumps(value, indent=1) + "\n"


def regenerate(text: str) -> str:
    def replace(match: re.Match) -> str:
        return f"{match.group(1)}```{match.group(4)}\n{render(match.group(2), match.group(3))}```"

    return _BLOCK.sub(replace, text)


def test_docs_examples_are_the_cli_output():
    text = PAGE.read_text()
    blocks = _BLOCK.findall(text)
    assert len(blocks) >= 3  # the tables and the JSON phases excerpt
    for _, kind, spec, _, body in blocks:
        assert body == render(kind, spec), (
            f"docs/planner.md is out of step for `{spec}`: run python {__file__}")


if __name__ == "__main__":
    PAGE.write_text(regenerate(PAGE.read_text()))
    sys.exit(0)
