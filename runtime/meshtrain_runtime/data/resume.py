"""A loader's state: what it holds, and the checks a resume makes before it reads anything.

The state is global, the same on every rank: global batches consumed, the position of the next
one (epoch, sample offset), the global batch size, seed, shuffle and the data's fingerprint.
Packing is a pure function of the data (``packing.py``), so there is no carry to store: the
fingerprint's ``packing`` and ``seq_len`` say how the samples were cut.
"""

from __future__ import annotations

from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.data.order import Cursor
from meshtrain_runtime.data.tokenize import describe_fingerprint

STATE_FORMAT = 1


def build_state(cursor: Cursor, *, batch_size: int, seed: int, shuffle: bool,
                fingerprint: dict[str, Any]) -> dict[str, Any]:
    return {"format": STATE_FORMAT, "batches": cursor.batch, "epoch": cursor.epoch,
            "offset": cursor.offset, "global_batch_size": batch_size, "seed": seed,
            "shuffle": shuffle, "fingerprint": fingerprint}


def cursor_from_state(state: Any, *, seed: int, shuffle: bool,
                      fingerprint: dict[str, Any]) -> Cursor:
    """The saved position, once the saved data, seed and shuffle are shown to be this loader's."""
    if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
        raise ConfigError("load_state_dict() takes what a loader's state_dict() returned (format "
                          f"{STATE_FORMAT}); got {type(state).__name__}.")
    changes = describe_changes(state["fingerprint"], fingerprint)
    if changes:
        raise ConfigError(
            f"the data changed since the checkpoint was saved: {'; '.join(changes)}. Resume with "
            "the data, tokenizer, seq_len and packing the checkpoint was written with, or start "
            "a new run without loading the loader's state.")
    for name, saved, now in (("seed", state["seed"], seed), ("shuffle", state["shuffle"],
                                                              shuffle)):
        if saved != now:
            raise ConfigError(
                f"loader({name}={now!r}), but the checkpoint's loader used {name}={saved!r}: "
                "another order would read some samples twice and skip others. Pass "
                f"{name}={saved!r} to resume.")
    return Cursor(int(state["batches"]), int(state["epoch"]), int(state["offset"]))


def describe_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    """What differs between two fingerprints, in words (empty when they are the same)."""
    changes = _source_changes(saved.get("source", {}), now.get("source", {}))
    if saved.get("tokenizer") != now.get("tokenizer"):
        changes.append(f"the tokenizer (saved: {describe_fingerprint(saved.get('tokenizer'))}; "
                       f"now: {describe_fingerprint(now.get('tokenizer'))})")
    for key in ("seq_len", "packing", "text_field"):
        if saved.get(key) != now.get(key):
            changes.append(f"{key} (saved: {saved.get(key)!r}; now: {now.get(key)!r})")
    if not changes and saved.get("samples") != now.get("samples"):
        changes.append(f"the number of samples (saved: {saved.get('samples')}; now: "
                       f"{now.get('samples')})")
    return changes


def _source_changes(saved: dict[str, Any], now: dict[str, Any]) -> list[str]:
    if "files" in saved and "files" in now:
        before, after = saved["files"], now["files"]
        changes = [f"file {name!r} is gone" for name in sorted(set(before) - set(after))]
        changes += [f"file {name!r} is new" for name in sorted(set(after) - set(before))]
        for name in sorted(set(before) & set(after)):
            old, new = before[name], after[name]
            if old["bytes"] != new["bytes"]:
                changes.append(f"file {name!r} changed ({old['bytes']} -> {new['bytes']} bytes)")
            elif old != new:
                changes.append(f"file {name!r} changed (same size, other content)")
        return changes
    if saved != now:
        return [f"the source (saved: {_brief(saved)}; now: {_brief(now)})"]
    return []


def _brief(identity: dict[str, Any]) -> str:
    if "files" in identity:
        return f"{len(identity['files'])} file(s)"
    return f"{identity.get('dataset')} of {identity.get('rows')} rows"


__all__ = ["STATE_FORMAT", "build_state", "cursor_from_state", "describe_changes"]
