"""Job names as the SageMaker SDK makes and SageMaker accepts them."""

from __future__ import annotations

import re
import time

from meshtrain.errors import ConfigError

JOB_NAME_PATTERN = re.compile(r"^[a-zA-Z0-9](-*[a-zA-Z0-9]){0,62}$")
MAX_JOB_NAME = 63


def name_from_base(base: str) -> str:
    """`<base>-YYYY-mm-dd-HH-MM-SS-mmm`, trimmed to 63 characters (SDK `name_from_base`)."""
    now = time.time()
    stamp = time.strftime("%Y-%m-%d-%H-%M-%S", time.gmtime(now)) + f"-{int(now * 1000) % 1000:03d}"
    return f"{base[: MAX_JOB_NAME - len(stamp) - 1]}-{stamp}"


def check_job_name(name: str, *, what: str = "job_name") -> str:
    if not isinstance(name, str) or not JOB_NAME_PATTERN.match(name):
        raise ConfigError(
            f"{what}={name!r} is not a valid SageMaker job name: 1-63 letters, digits and single "
            "hyphens, starting and ending with a letter or digit (pattern "
            f"{JOB_NAME_PATTERN.pattern}). Example: 'llama-hsdp-run-1'."
        )
    return name
