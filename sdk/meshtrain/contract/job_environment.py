"""A job's `environment` values go to its processes, never into meshtrain's own records.

`environment` is where users put secrets (HF_TOKEN, WANDB_API_KEY). The values cross to the
hosts in process environments only, as SageMaker injects `Environment` into its containers:
the client hands them to the job's first process (its supervisor, or the Slurm submission) in
one variable, MESHTRAIN_JOB_ENVIRONMENT (JSON; a process's environment is readable by its owner
alone), which gives them to every host it starts. spec.json, status.json and the history keep
the names with MASKED values; a failure reason has the values replaced by MASKED.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

from meshtrain.contract.errors import ConfigError

MASKED = "<masked>"
MESHTRAIN_JOB_ENVIRONMENT = "MESHTRAIN_JOB_ENVIRONMENT"
SHORTEST_SCRUBBED = 4
"""Shorter values are not replaced in free text ("1" would mask every digit)."""


def masked(environment: Mapping[str, str]) -> dict[str, str]:
    """The names of `environment`, each with the value MASKED."""
    return dict.fromkeys(environment, MASKED)


def masked_names(environment: Mapping[str, str]) -> list[str]:
    """The names whose value is MASKED (an environment read back from a job's records)."""
    return sorted(name for name, value in environment.items() if value == MASKED)


def encode(environment: Mapping[str, str]) -> str:
    """The value of MESHTRAIN_JOB_ENVIRONMENT for `environment`."""
    return json.dumps(dict(environment), sort_keys=True)


def values_from(process_env: Mapping[str, str], names: list[str]) -> dict[str, str]:
    """The job's environment values, read from MESHTRAIN_JOB_ENVIRONMENT in `process_env`.
    ConfigError when a recorded name did not arrive (the job's first process was started
    without the variable, e.g. a Slurm job submitted with --export=NONE)."""
    values = json.loads(process_env.get(MESHTRAIN_JOB_ENVIRONMENT) or "{}")
    missing = [name for name in names if name not in values]
    if missing:
        raise ConfigError(
            f"the job's environment values of {', '.join(missing)} did not reach this process "
            f"({MESHTRAIN_JOB_ENVIRONMENT} is not in its environment). meshtrain passes them "
            "through the environment of the job's processes only; a Slurm job needs sbatch's "
            "default --export=ALL.")
    return {name: str(values[name]) for name in names}


def scrub(text: str, environment: Mapping[str, str]) -> str:
    """`text` with every value of `environment` (of SHORTEST_SCRUBBED characters or more)
    replaced by MASKED: a traceback that printed a secret keeps it out of status.json."""
    for value in sorted(environment.values(), key=len, reverse=True):
        if len(value) >= SHORTEST_SCRUBBED and value != MASKED:
            text = text.replace(value, MASKED)
    return text


def check_values_given(environment: Mapping[str, str]) -> None:
    """ConfigError for an environment whose values are still MASKED (an Estimator rebuilt by
    attach() from a job's records, which keep no values), before anything is submitted."""
    names = masked_names(environment)
    if names:
        raise ConfigError(
            f"environment values of {', '.join(names)} are {MASKED!r}: this Estimator was "
            "rebuilt from a job's records (attach), which keep no environment values. Set "
            f"them again (estimator.environment[{names[0]!r}] = ...) before fit().")
