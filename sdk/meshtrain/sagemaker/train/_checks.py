"""SDK v3's ModelTrainer checks, as ConfigErrors with the fix, and meshtrain's own limits.

The SDK's (``ModelTrainer.model_post_init``): a training image or an algorithm (one of them),
a valid source_code (source_dir given with entry_script/requirements; those files inside it),
an entry_script when distributed is set, a hyperparameters file that exists and parses. Then
what meshtrain cannot run, refused rather than ignored: a marketplace algorithm, a source_dir
that is not a local folder, a shell command, a non-Python script, MPI options, heterogeneous
or preference-based clusters.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain.sagemaker.train.configs import Compute, SourceCode
from meshtrain.sagemaker.train.distributed import MPI, DistributedConfig


def check_image(training_image: str | None, algorithm_name: str | None) -> None:
    """One of training_image / algorithm_name (the SDK's rule); meshtrain runs images."""
    if not training_image and not algorithm_name:
        raise ConfigError("ModelTrainer needs training_image (the SDK's rule: at least one of "
                          "'training_image' or 'algorithm_name'). Pass training_image, e.g. "
                          "meshtrain's image ('meshtrain image build' makes it).")
    if training_image and algorithm_name:
        raise ConfigError("ModelTrainer takes only one of 'training_image' or 'algorithm_name'. "
                          "Remove one.")
    if algorithm_name:
        raise ConfigError(f"algorithm_name={algorithm_name!r}: meshtrain runs your script in a "
                          "training image, not marketplace algorithms. Pass training_image and "
                          "source_code instead.")


def check_source_code(source_code: SourceCode | None,
                      distributed: DistributedConfig | None) -> None:
    """The SDK's source_code rules, then what meshtrain runs: a Python entry_script in a local
    source_dir."""
    if source_code is None:
        raise ConfigError("ModelTrainer without source_code runs the image's own entry point; "
                          "meshtrain runs a script: pass source_code=SourceCode(source_dir=..., "
                          "entry_script='train.py').")
    if distributed is not None and not source_code.entry_script:
        raise ConfigError("Must provide 'entry_script' if 'distributed' is provided: torchrun "
                          "starts a script, e.g. SourceCode(source_dir=..., "
                          "entry_script='train.py').")
    if (source_code.requirements or source_code.entry_script) and not source_code.source_dir:
        raise ConfigError("If 'requirements' or 'entry_script' is provided in 'source_code', "
                          "'source_dir' must also be provided.")
    if source_code.command:
        raise ConfigError("SourceCode(command=...) is not supported by meshtrain: name the "
                          "script as entry_script (its arguments come from hyperparameters).")
    if not source_code.entry_script:
        raise ConfigError("SourceCode needs entry_script (meshtrain runs a script): pass "
                          "SourceCode(source_dir=..., entry_script='train.py').")
    _check_source_dir(source_code)


def _check_source_dir(source_code: SourceCode) -> None:
    source_dir = str(source_code.source_dir)
    root = Path(source_dir)
    if source_dir.startswith("s3://") or source_dir.endswith(".tar.gz"):
        raise ConfigError(f"source_dir={source_dir!r}: meshtrain packs a local folder for every "
                          "target; pass the folder the code is in (download or unpack it "
                          "first).")
    if not root.is_dir():
        raise ConfigError(f"Invalid 'source_dir' path: {source_dir}. Must be a valid local "
                          "directory.")
    for field in ("requirements", "entry_script"):
        value = getattr(source_code, field)
        if value and not (root / value).is_file():
            raise ConfigError(f"Invalid '{field}': {value}. Must be a valid file within the "
                              f"'source_dir' ({source_dir}).")
    if not str(source_code.entry_script).endswith(".py"):
        raise ConfigError(f"entry_script={source_code.entry_script!r}: meshtrain runs Python "
                          "scripts (*.py); start a shell script from a Python one.")


def check_distributed(distributed: DistributedConfig | None) -> None:
    if isinstance(distributed, MPI) and distributed.mpi_additional_options:
        raise ConfigError("MPI(mpi_additional_options=...): meshtrain starts an MPI config's "
                          "processes with torchrun (process_count_per_node on every host), so "
                          "mpirun options have nothing to apply to. Remove them.")


def check_compute(compute: Compute) -> None:
    """One homogeneous cluster per job (what every meshtrain target runs)."""
    for field in ("instance_groups", "instance_preferences"):
        if getattr(compute, field):
            raise ConfigError(f"Compute({field}=...): meshtrain runs one homogeneous cluster per "
                              "job. Pass instance_type and instance_count instead.")


def load_hyperparameters(value: dict[str, Any] | str | None) -> dict[str, Any]:
    """The hyperparameters dict, or the JSON / YAML file a string names (the SDK's reading)."""
    if value is None:
        return {}
    if isinstance(value, dict):
        return dict(value)
    path = Path(value)
    if not path.exists():
        raise ConfigError(f"Hyperparameters file not found: {value}. Pass a dict or the path "
                          "of a JSON or YAML file.")
    text = path.read_text()
    try:
        loaded = json.loads(text)
    except json.JSONDecodeError:
        loaded = _yaml_mapping(text, value)
    if not isinstance(loaded, dict):
        raise ConfigError(f"Invalid hyperparameters file: {value}. Must be a valid JSON or YAML "
                          "file holding a mapping.")
    return loaded


def _yaml_mapping(text: str, name: str) -> Any:
    try:
        import yaml
    except ModuleNotFoundError:
        raise ConfigError(f"hyperparameters file {name} is not JSON, and reading YAML needs "
                          "PyYAML (pip install pyyaml). Install it, or write the file as "
                          "JSON.") from None
    try:
        return yaml.safe_load(text)
    except yaml.YAMLError:
        raise ConfigError(f"Invalid hyperparameters file: {name}. Must be a valid JSON or YAML "
                          "file.") from None
