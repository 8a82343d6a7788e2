"""Turning pydantic validation errors into ConfigErrors a user can act on."""

from __future__ import annotations

import difflib
from collections.abc import Iterable

from pydantic import ValidationError

from meshtrain.contract.errors import ConfigError


def did_you_mean(word: str, choices: Iterable[str]) -> str:
    """A ' Did you mean X?' suffix when `word` is close to one of `choices`, else ''."""
    close = difflib.get_close_matches(str(word), list(choices), n=1, cutoff=0.6)
    return f" Did you mean {close[0]!r}?" if close else ""


def divisors(n: int) -> list[int]:
    """Every positive divisor of `n`, ascending: the degrees a size of `n` can be split by."""
    return [d for d in range(1, n + 1) if n % d == 0]


def divisors_text(n: int) -> str:
    """The divisors of `n` as a message lists them: ``"1, 2, 4 or 8"``."""
    values = [str(d) for d in divisors(n)]
    return values[0] if len(values) == 1 else f"{', '.join(values[:-1])} or {values[-1]}"


def counted(count: int, word: str, plural: str | None = None) -> str:
    """``1 host`` / ``2 hosts``: a count with its noun in the right number."""
    return f"{count} {word if count == 1 else plural or word + 's'}"


def hosts_and_processes(hosts: int, per_host: int) -> str:
    """``1 host x 2 processes``, as messages and views describe a cluster."""
    return f"{counted(hosts, 'host')} x {counted(per_host, 'process', 'processes')}"


def _location(prefix: str, loc: tuple) -> str:
    parts = [prefix] if prefix else []
    parts += [str(p) for p in loc if not str(p).startswith("function-")]
    return ".".join(parts) or "<root>"


def config_error_from(
    error: ValidationError, *, prefix: str, known_keys: dict[str, Iterable[str]]
) -> ConfigError:
    """One ConfigError listing every problem in `error`, each with its key and a fix."""
    lines = []
    for item in error.errors():
        loc = tuple(item["loc"])
        where = _location(prefix, loc)
        if item["type"] == "extra_forbidden":
            parent = ".".join(str(p) for p in loc[:-1])
            hint = (_belongs_elsewhere(str(loc[-1]), parent, prefix, known_keys)
                    or did_you_mean(loc[-1], known_keys.get(parent, ())))
            allowed = ", ".join(sorted(known_keys.get(parent, ())))
            lines.append(f"{where}: unknown key.{hint} Allowed keys: {allowed}.")
        else:
            # a validator's message may end in a period: the line adds exactly one
            msg = item["msg"].removeprefix("Value error, ").rstrip(".")
            given = "" if item["type"] == "value_error" else f" (got {_short(item.get('input'))})"
            lines.append(_sentence(f"{where}: {msg}{given}"))
    return ConfigError("Invalid distribution: " + " ".join(lines))


def _belongs_elsewhere(key: str, parent: str, prefix: str,
                       known_keys: dict[str, Iterable[str]]) -> str:
    """' It belongs under X.' when `key` is a key of another level (tensor_parallel_degree
    placed under torch_distributed), else ''."""
    homes = [other for other, keys in known_keys.items() if other != parent and key in keys]
    if not homes:
        return ""
    home = ".".join(part for part in (prefix, homes[0]) if part)
    return f" It belongs under {home}."


def arguments_error_from(error: ValidationError, *, what: str) -> ConfigError:
    """A ConfigError for a model built from plain arguments (e.g. JobSpec from the Estimator)."""
    lines = []
    for item in error.errors():
        where = ".".join(str(p) for p in item["loc"]) or "<root>"
        msg = item["msg"].removeprefix("Value error, ")
        lines.append(f"{where}: {msg} (got {_short(item.get('input'))}).")
    return ConfigError(f"Invalid {what} argument(s): " + " ".join(lines)
                       + " Pass the type shown in the argument's documentation.")


def _sentence(text: str) -> str:
    """`text` ending in exactly one period (a message may already end with its own)."""
    return text if text.endswith((".", "?", "!")) else f"{text}."


def _short(value: object, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."
