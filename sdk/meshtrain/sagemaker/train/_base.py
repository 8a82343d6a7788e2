"""The base of SDK v3's config classes: pydantic models whose mistakes are ConfigErrors.

SDK v3's configs are pydantic models with unknown fields forbidden and assignments validated;
these are too, with the same field names and defaults, and every validation error becomes a
`meshtrain.ConfigError` naming the class, the field and the fix. `to_request` turns a config
into its CreateTrainingJob shape as the SDK's ``sagemaker.core.utils.utils.serialize`` does:
PascalCase keys, unset (None) fields left out, and inside a shape falsy values left out too.
"""

from __future__ import annotations

from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationError

from meshtrain.contract._messages import did_you_mean
from meshtrain.contract.errors import ConfigError

SPECIAL_PASCAL_NAMES = {"volume_size_in_gb": "VolumeSizeInGB"}
"""Field names the SDK's snake_to_pascal spells by hand (the API's own spelling)."""


def snake_to_pascal(name: str) -> str:
    """`s3_output_path` -> `S3OutputPath`, as the SDK writes request keys."""
    return SPECIAL_PASCAL_NAMES.get(name) or "".join(part.title() for part in name.split("_"))


def _short(value: Any, limit: int = 80) -> str:
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def config_error(cls: type[BaseModel], error: ValidationError) -> ConfigError:
    """One ConfigError for every problem pydantic found building `cls`, each with its fix."""
    name, lines = cls.__name__, []
    for item in error.errors():
        where = ".".join(str(part) for part in item["loc"]) or "<root>"
        if item["type"] == "extra_forbidden":
            field = str(item["loc"][-1])
            known = list(cls.model_fields)
            lines.append(f"{name}({field}=...): unknown field.{did_you_mean(field, known)} "
                         f"{name} takes: {', '.join(known)}.")
            continue
        message = item["msg"].removeprefix("Value error, ").rstrip(".")
        if item["type"] == "value_error":  # a check of ours: its message says what to do
            lines.append(f"{message}.")
        else:
            lines.append(f"{name}.{where}: {message} (got {_short(item.get('input'))}).")
    return ConfigError(" ".join(lines))


class RaisesConfigError(BaseModel):
    """A pydantic model whose invalid construction or assignment raises meshtrain's
    ConfigError (the field, the value, the fix) instead of pydantic's ValidationError."""

    def __init__(self, **data: Any) -> None:
        try:
            super().__init__(**data)
        except ValidationError as error:
            raise config_error(type(self), error) from None

    def __setattr__(self, name: str, value: Any) -> None:
        try:
            super().__setattr__(name, value)
        except ValidationError as error:
            raise config_error(type(self), error) from None


class BaseConfig(RaisesConfigError):
    """`sagemaker.train.configs.BaseConfig`: unknown fields refused, assignments validated."""

    model_config = ConfigDict(validate_assignment=True, extra="forbid")


def to_request(value: Any) -> Any:
    """A config, list or dict as the CreateTrainingJob request carries it (None: left out)."""
    if value is None:
        return None
    if isinstance(value, BaseModel):
        shape = {}
        for field in type(value).model_fields:
            serialized = to_request(getattr(value, field))
            if serialized:  # the SDK drops falsy fields of a shape (False, 0, "", {})
                shape[snake_to_pascal(field)] = serialized
        return shape
    if isinstance(value, dict):
        return {key: item for key, item in ((k, to_request(v)) for k, v in value.items())
                if item is not None}
    if isinstance(value, list | tuple):
        return [item for item in (to_request(v) for v in value) if item is not None]
    return value
