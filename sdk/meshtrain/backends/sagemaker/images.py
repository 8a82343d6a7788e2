"""AWS PyTorch training images from `framework_version` + `py_version`, as SDK v2 picks them.

The version/region table is data: ``pytorch_images.json`` beside this file, written from the
SageMaker Python SDK's ``image_uri_config/pytorch.json`` and ``pytorch-smp.json`` by
``tests/sdk/backends/sagemaker/real_sdk/make_image_table.py`` (its ``source`` says which SDK).
The rules are the SDK's ``image_uris.get_training_image_uri`` and ``retrieve``: an SMP v2
distribution (torch_distributed + smdistributed.modelparallel enabled) switches to the
``smdistributed-modelparallel`` image with a CUDA tag; the tag is
``<version>-<processor>-<py_version>[-<cuda>]``; the URI ``<account>.dkr.<ECR host>/<repo>:<tag>``.
"""

from __future__ import annotations

import json
from functools import lru_cache
from importlib import resources
from typing import Any

from meshtrain.contract.distribution import DistributionConfig
from meshtrain.contract.errors import ConfigError
from meshtrain.instances import InstanceSpec

TABLE_FILE = "pytorch_images.json"
SMP_CU124 = ("2.5",)
SMP_CU121 = ("2.1", "2.2", "2.3", "2.4")


@lru_cache(maxsize=1)
def image_table() -> dict[str, Any]:
    """The packaged table (read once)."""
    text = resources.files("meshtrain.backends.sagemaker").joinpath(TABLE_FILE).read_text()
    return json.loads(text)


def uses_smp_image(config: DistributionConfig | None) -> bool:
    """SDK rule: torch_distributed and smdistributed.modelparallel, enabled unless it says
    False (a modelparallel block without "enabled" counts, as in the SDK)."""
    if config is None or config.smdistributed is None:
        return False
    modelparallel = config.smdistributed.modelparallel
    if modelparallel is None:
        return False
    return modelparallel.enabled or "enabled" not in modelparallel.model_fields_set


def _smp_cuda(framework_version: str, instance: InstanceSpec) -> str:
    # Substring tests, as the SDK writes them ("p5" in the instance type: the p5 families).
    if any(v in framework_version for v in SMP_CU124):
        return "cu124"
    if instance.family.startswith("p5") or any(v in framework_version for v in SMP_CU121):
        return "cu121"
    return "cu118"


def _processor(instance: InstanceSpec, available: list[str]) -> str:
    if instance.processor not in available:
        raise ConfigError(f"instance_type={instance.instance_type!r}: AWS's PyTorch training "
                          f"images for this framework come for {', '.join(available)} "
                          "instances only; choose such a type, or pass image_uri.")
    return instance.processor


def _version_config(framework: str, config: dict[str, Any], version: str) -> dict[str, Any]:
    aliases, versions = config["version_aliases"], config["versions"]
    if version not in versions and version not in aliases:
        known = sorted({*versions, *aliases}, key=_version_key)
        what = "SMP v2 (smdistributed-modelparallel)" if framework == "pytorch-smp" else "PyTorch"
        raise ConfigError(f"framework_version={version!r} has no AWS {what} training image. "
                          f"Known versions: {', '.join(known)}. Pick one, or pass image_uri.")
    return versions[aliases.get(version, version)]


def _version_key(version: str) -> tuple[int, ...]:
    return tuple(int(part) if part.isdigit() else 0 for part in version.split("."))


def training_image_uri(region: str, framework_version: str, py_version: str,
                       instance: InstanceSpec, config: DistributionConfig | None = None) -> str:
    """The AWS training image the SDK's PyTorch estimator would use; ConfigError if none."""
    table = image_table()
    framework = "pytorch-smp" if uses_smp_image(config) else "pytorch"
    framework_config = table["frameworks"][framework]
    version_config = _version_config(framework, framework_config, framework_version)
    py_versions = version_config.get("py_versions") or []
    if py_version not in py_versions:
        raise ConfigError(f"py_version={py_version!r} is not available for framework_version="
                          f"{framework_version!r}: known {', '.join(py_versions) or 'none'}.")
    registries = table["registries"][version_config["registries"]]
    if region not in registries:
        raise ConfigError(f"AWS publishes no {version_config['repository']} image for "
                          f"framework_version={framework_version!r} in region {region!r}. "
                          f"Regions: {', '.join(sorted(registries))}.")
    processor = _processor(instance, framework_config.get("processors")
                           or version_config.get("processors") or ["cpu", "gpu"])
    cuda = _smp_cuda(framework_version, instance) if framework == "pytorch-smp" else None
    prefix = version_config.get("tag_prefix", framework_version)
    tag = "-".join(x for x in (prefix, processor, py_version, cuda) if x)
    return (f"{registries[region]}.dkr.{table['ecr_hostnames'][region]}/"
            f"{version_config['repository']}:{tag}")


def check_framework_versions(framework_version: str | None, py_version: str | None,
                             instance: InstanceSpec, config: DistributionConfig | None) -> None:
    """The SDK's checks when the image comes from the versions (no image_uri): both versions
    given, and torch_distributed only with the versions the SDK allows on GPU types."""
    if framework_version is None or py_version is None:
        raise ConfigError("without image_uri, SageMaker jobs need framework_version and "
                          "py_version (e.g. framework_version='2.5.1', py_version='py311') to "
                          "pick AWS's PyTorch training image, or image_uri, or "
                          "$MESHTRAIN_IMAGE_URI for meshtrain's own image.")
    enabled = config is not None and config.torch_distributed.enabled
    allowed = image_table()["torch_distributed_gpu_versions"]
    if enabled and instance.processor == "gpu" and framework_version not in allowed:
        raise ConfigError(f"framework_version={framework_version!r} is not supported by "
                          f"torch_distributed on {instance.instance_type} (SageMaker SDK). "
                          "Supported: "
                          f"{', '.join(allowed)}.")
    if enabled and "py3" not in py_version:
        raise ConfigError(f"py_version={py_version!r}: torch_distributed needs a py3 version.")
