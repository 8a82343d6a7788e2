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


def channel_arg(text: str) -> tuple[str, str]:
    """`--input CHANNEL=PATH` (a local path or URI): (channel, path)."""
    channel, sep, path = text.partition("=")
    if not sep or not channel or not path:
        raise argparse.ArgumentTypeError(f"expected CHANNEL=PATH, e.g. train=./data, got {text!r}")
    return channel, path
