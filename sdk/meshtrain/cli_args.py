"""Argument types the `meshtrain` subcommands share."""

from __future__ import annotations

import argparse
import json


def json_object_arg(text: str) -> dict:
    """A JSON object given on the command line (argparse's error for anything else)."""
    try:
        value = json.loads(text)
    except json.JSONDecodeError as error:
        raise argparse.ArgumentTypeError(f"not valid JSON: {error}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("JSON nested too deeply") from None
    if not isinstance(value, dict):
        raise argparse.ArgumentTypeError("expected a JSON object")
    return value
