"""Job names as the SageMaker SDK makes and SageMaker accepts them."""

from __future__ import annotations

import re
import secrets
import time

from meshtrain.contract.errors import ConfigError
from meshtrain.estimator_values import shown, whitespace_hint

JOB_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_JOB_NAME = 63
GENERATED_STAMP = re.compile(r"-\d{4}(-\d{2}){5}-\d{3}$")  # what name_from_base appends
RANDOM_SUFFIX_HEX = 6


def name_from_base(base: str) -> str:
    """`<base>-YYYY-mm-dd-HH-MM-SS-mmm`, trimmed to 63 characters (SDK `name_from_base`)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}"
    return f"{base[: MAX_JOB_NAME - len(stamp) - 1]}-{stamp}"


def is_generated_name(name: str) -> bool:
    """True for a name `name_from_base` made (it may get a random suffix on a collision)."""
    return GENERATED_STAMP.search(name) is not None


def with_random_suffix(name: str) -> str:
    """`name` with `-<6 random hex digits>`, trimmed to 63 characters: a generated name that
    another submitter took in the same millisecond is made unique this way."""
    suffix = secrets.token_hex(RANDOM_SUFFIX_HEX // 2)
    return f"{name[: MAX_JOB_NAME - len(suffix) - 1]}-{suffix}"


def check_job_name(name: str, *, what: str = "job_name") -> str:
    """`name` if SageMaker accepts it as a job name (the whole string: no trailing newline)."""
    if not isinstance(name, str) or not JOB_NAME_PATTERN.fullmatch(name):
        raise ConfigError(
            f"{what}={shown(name)} is not a valid SageMaker job name{whitespace_hint(name)}: "
            "1-63 letters, digits and single hyphens, starting and ending with a letter or digit "
            f"(pattern {JOB_NAME_PATTERN.pattern}). Example: 'llama-hsdp-run-1'."
        )
    return name
