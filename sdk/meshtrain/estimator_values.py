"""Checks of the Estimator's value arguments: hyperparameters, environment, tags, scalars.

Every check runs before any job directory, process or request exists and raises a ConfigError
that names the argument and the fix. Limits that come from the operating system are explained
with their arithmetic.
"""

from __future__ import annotations

import json
import math
import re
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
            raise ConfigError(f"{where}={item!r} is not a finite number: JSON has no NaN or "
                              "infinity. Pass a finite number, or a string such as 'inf' that "
                              "the script parses.")
        if isinstance(item, str) and "\x00" in item:
            raise ConfigError(f"{where} contains a NUL character, which cannot be passed in a "
                              "command line or environment variable. Remove it.")
        if isinstance(item, Mapping):
            for key, child in item.items():
                if not isinstance(key, str):
                    raise ConfigError(f"{where} has the key {key!r}: JSON object keys must be "
                                      "strings.")
                stack.append((child, depth + 1, f"{where}[{key!r}]"))
        elif isinstance(item, list | tuple):
            stack.extend((child, depth + 1, f"{where}[{i}]") for i, child in enumerate(item))
        elif item is not None and not isinstance(item, bool | int | float | str):
            raise ConfigError(f"{where}={item!r} is not JSON-serialisable ({type(item).__name__}); "
                              "use strings, numbers, bools, None, lists or dicts.")


def check_hyperparameters(hyperparameters: Any) -> dict[str, Any]:
    """Names (their documented pattern), values (finite JSON, bounded depth) and total size."""
    if not isinstance(hyperparameters, Mapping):
        raise ConfigError(f"hyperparameters must be a dict, got {type(hyperparameters).__name__}.")
    for key, value in hyperparameters.items():
        if not isinstance(key, str) or not key:
            raise ConfigError(f"hyperparameter names must be non-empty strings, got {key!r}.")
        if not HYPERPARAMETER_NAME.match(key):
            raise ConfigError(
                f"hyperparameter name {key!r} is invalid: the script receives it as '--{key}' "
                "and as the variable SM_HP_<NAME>, so use 1-256 letters, digits, '_', '.' or '-', "
                f"starting with a letter, digit or '_' (pattern {HYPERPARAMETER_NAME.pattern}).")
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
        what = (f"the distribution encodes {encoded[key]!r}" if key in encoded
                else "the distribution does not set it")
        source = ("set SMP parameters in distribution['smdistributed']['modelparallel']"
                  "['parameters']" if key == MP_PARAMETERS else
                  "set processes_per_host / enabled in distribution['torch_distributed']")
        raise ConfigError(
            f"hyperparameters[{key!r}] is reserved for what meshtrain sends to the hosts "
            f"({what}; got {value!r}). Remove it: {source}, or rename your hyperparameter.")


def check_environment(environment: Any) -> dict[str, str]:
    if not isinstance(environment, Mapping):
        raise ConfigError("environment must be a dict of str -> str.")
    for key, value in environment.items():
        if not isinstance(key, str) or not ENV_KEY_PATTERN.match(key):
            raise ConfigError(f"environment variable name {key!r} is invalid: use letters, "
                              "digits and '_', not starting with a digit (at most 512).")
        if not isinstance(value, str):
            raise ConfigError(f"environment[{key!r}] must be a string, got {value!r}.")
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
            raise ConfigError(f"{name}[{i}]={item!r} must be {shape}.")
        for key in keys:
            text, (low, high) = item[key], limits[key]
            if not isinstance(text, str) or not low <= len(text) <= high or any(
                    c in text for c in "\n\r\x00"):
                raise ConfigError(f"{name}[{i}][{key!r}]={text!r} must be a one-line string of "
                                  f"{low}-{high} characters: {name} entries must be {shape}.")
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
                              f"valid ({error}): {metric['Regex']!r}.") from None
        if groups < 1:
            raise ConfigError(f"metric_definitions[{i}]['Regex']={metric['Regex']!r} needs a "
                              "capture group around the value, e.g. 'loss=([0-9.]+)'.")
    return checked


def check_scalars(*, volume_size: Any, input_mode: Any, container_log_level: Any,
                  preflight: Any, use_spot_instances: Any) -> None:
    """The Estimator's scalar settings, each against its type and documented range."""
    if isinstance(volume_size, bool) or not isinstance(volume_size, int) or not (
            0 <= volume_size <= 16384):
        raise ConfigError(f"volume_size must be an int from 0 to 16384 (GB), got "
                          f"{volume_size!r}.")
    if input_mode not in INPUT_MODES:
        raise ConfigError(f"input_mode={input_mode!r} must be one of {', '.join(INPUT_MODES)}.")
    if isinstance(container_log_level, bool) or not isinstance(container_log_level, int) or not (
            0 <= container_log_level <= 50):
        raise ConfigError(f"container_log_level={container_log_level!r} must be a logging level "
                          "from 0 to 50, e.g. logging.INFO (20).")
    for name, value in (("preflight", preflight), ("use_spot_instances", use_spot_instances)):
        if not isinstance(value, bool):
            raise ConfigError(f"{name} must be True or False, got {value!r}.")


def check_optional_strings(**values: Any) -> None:
    """Arguments that are a one-line string or None (role, image_uri, versions, paths)."""
    for name, value in values.items():
        if value is None:
            continue
        if not isinstance(value, str) or not value or any(c in value for c in "\n\r\x00"):
            raise ConfigError(f"{name} must be a non-empty one-line string or None, got "
                              f"{value!r}.")
