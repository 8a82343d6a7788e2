"""Checks of the Estimator's value arguments: hyperparameters, environment, tags, scalars.

Every check runs before any job directory, process or request exists and raises a ConfigError
that names the argument and the fix. Limits that come from the operating system are explained
with their arithmetic.
"""

from __future__ import annotations

import json
import math
import re
import reprlib
from collections.abc import Mapping
from typing import Any

from meshtrain.contract import hyperparameters as hp
from meshtrain.contract.errors import ConfigError
from meshtrain.contract.hyperparameters import SAGEMAKER_RESERVED

HYPERPARAMETER_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.\-]{0,255}$")
ENV_KEY_PATTERN = re.compile(r"^[a-zA-Z_][a-zA-Z0-9_]{0,511}$")
MAX_NESTING = 32
"""Deepest nesting of lists/dicts in one hyperparameter value (JSON stays readable, no
RecursionError in json or in the toolkit's decoding)."""
MAX_ARG_STRLEN = 131072
"""Linux's limit on one argument or environment string (32 pages of 4 KiB, MAX_ARG_STRLEN)."""
MAX_HYPERPARAMETER_BYTES = MAX_ARG_STRLEN // 2
"""All hyperparameters as JSON: the host exports them in SM_HPS and again inside
SM_TRAINING_ENV, one environment string each; half of MAX_ARG_STRLEN leaves room for the rest
of SM_TRAINING_ENV (paths, channels, resource config)."""
MAX_ENVIRONMENT_BYTES = MAX_ARG_STRLEN
"""All `environment` entries together (the hosts' environment also carries the SM_* variables)."""
INPUT_MODES = ("File", "Pipe", "FastFile")
RESERVED_PREFIX = hp.FRAMEWORK_PREFIX
MP_PARAMETERS = hp.MP_PARAMETERS
URI_SCHEME = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://")
STORAGE_ARGUMENTS = ("output_path", "checkpoint_s3_uri", "checkpoint_local_path")
STORAGE_SCHEMES = ("s3", "file", "pvc")
"""The URI schemes some backend stores outputs and checkpoints at (anything else is refused)."""
SHOWN_CHARACTERS = 300
"""The most of a value's repr a message quotes: a 1.4-million-character repr of a bad value
would bury the fix (and a terminal) under the value."""
_REPR = reprlib.Repr()
_REPR.maxstring = _REPR.maxother = 120
_REPR.maxlist = _REPR.maxtuple = _REPR.maxset = _REPR.maxfrozenset = _REPR.maxdict = 8
_REPR.maxlevel = 3


def shown(value: Any) -> str:
    """repr(value) for a message, capped at SHOWN_CHARACTERS (long strings and containers cut in
    the middle by reprlib, any other long repr at the end), with how long the full repr was."""
    text = repr(value) if isinstance(value, str) and len(value) <= 120 else _REPR.repr(value)
    if len(text) <= SHOWN_CHARACTERS:
        return text
    return f"{text[:SHOWN_CHARACTERS]}... (cut to {SHOWN_CHARACTERS} characters)"


def whitespace_hint(name: Any) -> str:
    """A hint for a name with whitespace around it (a trailing newline from a file or input())."""
    if not isinstance(name, str) or name == name.strip() or not name.strip():
        return ""
    return (" (whitespace around it, such as a trailing newline: did you mean "
            f"{shown(name.strip())}?)")


def _walk_value(name: str, value: Any) -> None:
    """Refuse NaN/inf, non-JSON types, str-less keys and nesting deeper than MAX_NESTING.

    Iterative (an explicit stack), so a 100,000-deep list is a ConfigError, not a RecursionError.
    """
    stack: list[tuple[Any, int, str]] = [(value, 0, name)]
    while stack:
        item, depth, where = stack.pop()
        if depth > MAX_NESTING:
            raise ConfigError(f"{where} nests lists/dicts deeper than {MAX_NESTING} levels. "
                              "Flatten it, or put the structure in a JSON file in source_dir.")
        if isinstance(item, float) and not math.isfinite(item):
            raise ConfigError(f"{where}={shown(item)} is not a finite number: JSON has no NaN or "
                              "infinity. Pass a finite number, or a string such as 'inf' that "
                              "the script parses.")
        if isinstance(item, str) and "\x00" in item:
            raise ConfigError(f"{where} contains a NUL character, which cannot be passed in a "
                              "command line or environment variable. Remove it.")
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{where} has the key {shown(key)}: JSON object keys must be "
                                      "strings.")
                stack.append((child, depth + 1, f"{where}[{shown(key)}]"))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise ConfigError(f"{where}={shown(item)} is not JSON-serialisable "
                              f"({type(item).__name__}); "
                              "use strings, numbers, bools, None, lists or dicts.")


def check_hyperparameters(hyperparameters: Any) -> dict[str, Any]:
    """Names (their documented pattern), values (finite JSON, bounded depth) and total size."""
    if not isinstance(hyperparameters, Mapping):
        raise ConfigError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}.")
    for key, value in hyperparameters.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"hyperparameter names must be non-empty strings, got {shown(key)}.")
        if not HYPERPARAMETER_NAME.fullmatch(key):
            raise ConfigError(
                f"hyperparameter name {shown(key)} is invalid{whitespace_hint(key)}: the script "
                "receives it as '--<name>' and as the variable SM_HP_<NAME>, so use 1-256 "
                "letters, digits, '_', '.' or '-', starting with a letter, digit or '_' (pattern "
                f"{HYPERPARAMETER_NAME.pattern}).")
        _walk_value(f"hyperparameters[{key!r}]", value)
    size = len(json.dumps(dict(hyperparameters)).encode())
    if size > MAX_HYPERPARAMETER_BYTES:
        biggest = sorted(hyperparameters, key=lambda k: -len(json.dumps(hyperparameters[k])))[:3]
        raise ConfigError(
            f"hyperparameters take {size} bytes as JSON, more than {MAX_HYPERPARAMETER_BYTES}: "
            f"hosts export them in environment variables, and Linux limits one such string to "
            f"{MAX_ARG_STRLEN} bytes (MAX_ARG_STRLEN), shared with the rest of SM_TRAINING_ENV. "
            f"Largest: {', '.join(biggest)}. Put large values in a file in source_dir or an "
            "input channel and pass its name.")
    return dict(hyperparameters)


def is_reserved_hyperparameter(key: str) -> bool:
    return key.startswith(RESERVED_PREFIX) or key == MP_PARAMETERS or key in SAGEMAKER_RESERVED


def check_reserved_hyperparameters(
    hyperparameters: Mapping[str, Any], encoded: Mapping[str, Any]
) -> None:
    """`sagemaker_*` / `mp_parameters` only where they equal what the distribution encodes.

    `encoded` is `JobSpec.distribution_hyperparameters()`: a user value that differs from it
    would change the world size or the parameters behind the client's checks.
    """
    for key, value in hyperparameters.items():
        if not is_reserved_hyperparameter(key):
            continue
        if key in encoded and encoded[key] == value:
            continue
        what = (f"the distribution encodes {shown(encoded[key])}" if key in encoded
                else "the distribution does not set it")
        source = ("set SMP parameters in distribution['smdistributed']['modelparallel']"
                  "['parameters']" if key == MP_PARAMETERS else
                  "set processes_per_host / enabled in distribution['torch_distributed']")
        raise ConfigError(
            f"hyperparameters[{key!r}] is reserved for what meshtrain sends to the hosts "
            f"({what}; got {shown(value)}). Remove it: {source}, or rename your hyperparameter.")


def check_environment(environment: Any) -> dict[str, str]:
    if not isinstance(environment, Mapping):
        raise ConfigError("environment must be a dict of str -> str.")
    for key, value in environment.items():
        if not isinstance(key, str) or not ENV_KEY_PATTERN.fullmatch(key):
            raise ConfigError(f"environment variable name {shown(key)} is invalid"
                              f"{whitespace_hint(key)}: use letters, digits and '_', not "
                              "starting with a digit (at most 512).")
        if not isinstance(value, str):
            raise ConfigError(f"environment[{key!r}] must be a string, got {shown(value)}.")
        if "\x00" in value:
            raise ConfigError(f"environment[{key!r}] contains a NUL character, which an "
                              "environment variable cannot hold. Remove it.")
    size = sum(len(k.encode()) + len(v.encode()) + 2 for k, v in environment.items())
    if size > MAX_ENVIRONMENT_BYTES:
        raise ConfigError(f"environment takes {size} bytes, more than {MAX_ENVIRONMENT_BYTES} "
                          "(the hosts' environment also carries the SM_* variables, within the "
                          "OS argument limit). Pass large values in a file in source_dir.")
    return dict(environment)


def _check_string_list(name: str, value: Any, keys: tuple[str, ...],
                       limits: dict[str, tuple[int, int]]) -> list[dict[str, str]]:
    if not isinstance(value, list | tuple):
        raise ConfigError(f"{name} must be a list of dicts with keys {', '.join(keys)}.")
    checked = []
    for i, item in enumerate(value):
        shape = "{" + ", ".join(f"'{k}': <{lo}-{hi} chars>" for k, (lo, hi) in limits.items()) + "}"
        if not isinstance(item, Mapping) or set(item) != set(keys):
            raise ConfigError(f"{name}[{i}]={shown(item)} must be {shape}.")
        for key in keys:
            text, (low, high) = item[key], limits[key]
            if not isinstance(text, str) or not low <= len(text) <= high or any(
                    c in text for c in "\n\r\x00"):
                raise ConfigError(f"{name}[{i}][{key!r}]={shown(text)} must be a one-line "
                                  f"string of {low}-{high} characters: {name} entries must be "
                                  f"{shape}.")
        checked.append(dict(item))
    return checked


def check_tags(tags: Any) -> list[dict[str, str]]:
    """SageMaker's Tag shape: [{'Key': ..., 'Value': ...}] (Key <= 128, Value <= 256)."""
    return _check_string_list("tags", tags or [], ("Key", "Value"),
                              {"Key": (1, 128), "Value": (0, 256)})


def check_metric_definitions(metrics: Any) -> list[dict[str, str]]:
    """[{'Name': ..., 'Regex': ...}], each Regex compiling with one capture group."""
    checked = _check_string_list("metric_definitions", metrics or [], ("Name", "Regex"),
                                 {"Name": (1, 255), "Regex": (1, 500)})
    for i, metric in enumerate(checked):
        try:
            groups = re.compile(metric["Regex"]).groups
        except re.error as error:
            raise ConfigError(f"metric_definitions[{i}] (metric {metric['Name']!r}): Regex is not "
                              f"valid ({error}): {shown(metric['Regex'])}.") from None
        if groups < 1:
            raise ConfigError(f"metric_definitions[{i}]['Regex']={shown(metric['Regex'])} needs a "
                              "capture group around the value, e.g. 'loss=([0-9.]+)'.")
    return checked


def check_scalars(*, volume_size: Any, input_mode: Any, container_log_level: Any,
                  preflight: Any, use_spot_instances: Any) -> None:
    """The Estimator's scalar settings, each against its type and documented range."""
    if isinstance(volume_size, bool) or not isinstance(volume_size, int) or not (
            0 <= volume_size <= 16384):
        raise ConfigError(f"volume_size must be an int from 0 to 16384 (GB), got "
                          f"{shown(volume_size)}.")
    if input_mode not in INPUT_MODES:
        raise ConfigError(f"input_mode={shown(input_mode)} must be one of "
                          f"{', '.join(INPUT_MODES)}.")
    if isinstance(container_log_level, bool) or not isinstance(container_log_level, int) or not (
            0 <= container_log_level <= 50):
        raise ConfigError(f"container_log_level={shown(container_log_level)} must be a logging "
                          "level from 0 to 50, e.g. logging.INFO (20).")
    for name, value in (("preflight", preflight), ("use_spot_instances", use_spot_instances)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {shown(value)}.")


def check_optional_strings(**values: Any) -> None:
    """Arguments that are a one-line string or None (role, image_uri, versions, paths)."""
    for name, value in values.items():
        if value is None:
            continue
        if not isinstance(value, str) or not value or any(c in value for c in "\n\r\x00"):
            raise ConfigError(f"{name} must be a non-empty one-line string or None, got "
                              f"{shown(value)}.")
        scheme = URI_SCHEME.match(value)
        if name in STORAGE_ARGUMENTS and scheme and scheme.group(1) not in STORAGE_SCHEMES:
            raise ConfigError(
                f"{name}={shown(value)}: no backend reads or writes {scheme.group(1)}:// URIs. "
                "Use s3://BUCKET/PREFIX (SageMaker; local jobs upload there too), pvc://CLAIM"
                "[/PATH] (Kubernetes), or a local directory or file:// path (local and Docker "
                "jobs).")
