"""Write meshtrain's AWS PyTorch training-image table from the real SageMaker Python SDK.

Run with the test extras installed (``pip install -e '.[dev]'``, which holds the SDK):

    python tests/sdk/backends/sagemaker/real_sdk/make_image_table.py

It reads the SDK package's ``image_uri_config/pytorch.json`` ("training" scope) and
``image_uri_config/pytorch-smp.json`` and writes ``sdk/meshtrain/backends/sagemaker/
pytorch_images.json``: the same shapes (version_aliases, processors, versions -> py_versions,
repository, registries), with each distinct region -> account map stored once.
"""

from __future__ import annotations

import json
from importlib import metadata, resources
from pathlib import Path

TABLE = (Path(__file__).resolve().parents[5] / "sdk" / "meshtrain" / "backends" / "sagemaker"
         / "pytorch_images.json")
SCOPES = {"pytorch": "training", "pytorch-smp": "training"}
VERSION_KEYS = ("py_versions", "repository", "tag_prefix", "container_version", "processors")


def _table(framework: str, registries: dict[str, dict[str, str]]) -> dict:
    config_dir = resources.files("sagemaker") / "image_uri_config"
    scope = json.loads((config_dir / f"{framework}.json").read_text())[SCOPES[framework]]
    versions = {}
    for version, config in scope["versions"].items():
        key = json.dumps(config["registries"], sort_keys=True)
        name = next((n for n, r in registries.items() if json.dumps(r, sort_keys=True) == key),
                    f"accounts-{len(registries) + 1}")
        registries[name] = config["registries"]
        versions[version] = {k: config[k] for k in VERSION_KEYS if k in config}
        versions[version]["registries"] = name
    return {"processors": scope.get("processors"),
            "version_aliases": scope.get("version_aliases", {}), "versions": versions}


def _ecr_hostname(region: str) -> str:
    """ECR's hostname in `region`, as the SDK's `image_uris.retrieve` gets it (botocore)."""
    from sagemaker import utils

    endpoint = utils._botocore_resolver().construct_endpoint("ecr", region)
    return endpoint["hostname"] if endpoint else f"ecr.{region}.amazonaws.com"


def _torch_distributed_versions() -> list[str]:
    """The versions the SDK allows torch_distributed with on GPU types (fw_utils)."""
    from sagemaker import fw_utils

    return list(fw_utils.TORCH_DISTRIBUTED_GPU_SUPPORTED_FRAMEWORK_VERSIONS)


def main() -> None:
    registries: dict[str, dict[str, str]] = {}
    frameworks = {name: _table(name, registries) for name in SCOPES}
    regions = sorted({region for accounts in registries.values() for region in accounts})
    table = {
        "ecr_hostnames": {region: _ecr_hostname(region) for region in regions},
        "source": (f"SageMaker Python SDK {metadata.version('sagemaker')}: src/sagemaker/"
                   "image_uri_config/pytorch.json (scope 'training') and pytorch-smp.json; "
                   "ECR hostnames from botocore; "
                   "torch_distributed versions from fw_utils.py; "
                   "written by tests/sdk/backends/sagemaker/real_sdk/make_image_table.py"),
        "frameworks": frameworks,
        "torch_distributed_gpu_versions": _torch_distributed_versions(),
        "registries": registries,
    }
    TABLE.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    print(f"wrote {TABLE} ({TABLE.stat().st_size} bytes)")


if __name__ == "__main__":
    main()
