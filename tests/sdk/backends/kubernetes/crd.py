"""Strict validation of rendered objects against the Kubeflow CRDs plus the operator's admission
rules: the CRDs' openAPIV3 schemas as JSON Schema with unknown fields forbidden."""

from __future__ import annotations

import os
import re
from functools import cache
from pathlib import Path
from typing import Any

import jsonschema
import yaml
from ci_guards import missing_component

# The shared reference material lies beside the checkout (../shared); it is never copied into the
# project (its README says so). MESHTRAIN_SHARED_SCHEMAS points elsewhere when it lives somewhere
# else. Where it is absent the tests say they are skipped, and fail under CI=true, where it is
# beside the checkout (tests/ci_guards.py).
REPO = Path(__file__).resolve().parents[4]
SCHEMAS = Path(os.environ.get("MESHTRAIN_SHARED_SCHEMAS", REPO.parent / "shared" / "schemas"))
DNS_1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def _strict(node: Any) -> Any:
    """openAPIV3 -> JSON Schema: nullable, int-or-string, and no unknown fields where the CRD
    lists the properties (unless it says unknown fields are kept)."""
    if isinstance(node, list):
        return [_strict(item) for item in node]
    if not isinstance(node, dict):
        return node
    out = {key: _strict(value) for key, value in node.items()
           if not key.startswith("x-kubernetes-validations")}
    if out.pop("x-kubernetes-int-or-string", False):
        out.pop("type", None)
        out["anyOf"] = [{"type": "integer"}, {"type": "string"}]
    if out.pop("nullable", False) and isinstance(out.get("type"), str):
        out["type"] = [out["type"], "null"]
    keep_unknown = out.pop("x-kubernetes-preserve-unknown-fields", False)
    if "properties" in out and "additionalProperties" not in out and not keep_unknown:
        out["additionalProperties"] = False
    return out


def require_schemas() -> None:
    """Skip the calling test, saying why, where the shared CRD schemas are not at hand (fail
    under CI=true)."""
    if not (SCHEMAS / "kubeflow.org_pytorchjobs.yaml").is_file():
        missing_component(f"the Kubeflow CRD schemas are not at {SCHEMAS} (the shared reference "
                          "beside the checkout; set MESHTRAIN_SHARED_SCHEMAS to their folder)")


@cache
def schema(kind: str) -> dict[str, Any]:
    name = {"PyTorchJob": "kubeflow.org_pytorchjobs.yaml",
            "TrainJob": "trainer.kubeflow.org_trainjobs.yaml"}[kind]
    crd = yaml.safe_load((SCHEMAS / name).read_text())
    return _strict(crd["spec"]["versions"][0]["schema"]["openAPIV3Schema"])


def admission_errors(job: dict[str, Any]) -> list[str]:
    """The operator's rules the schema does not carry."""
    errors = []
    name = job["metadata"]["name"]
    if not DNS_1035.match(name) or len(name) > 63:
        errors.append(f"name {name!r} is not DNS-1035")
    if job["kind"] == "PyTorchJob":
        replicas = job["spec"]["pytorchReplicaSpecs"]
        if set(replicas) - {"Master", "Worker"}:
            errors.append(f"replica types {sorted(replicas)}: only Master and Worker")
        if replicas.get("Master", {}).get("replicas") != 1:
            errors.append("exactly one Master")
        for replica in replicas.values():
            containers = replica.get("template", {}).get("spec", {}).get("containers", [])
            if not any(c["name"] == "pytorch" and c.get("image") for c in containers):
                errors.append("no container named 'pytorch' with an image")
    return errors


def validate(job: dict[str, Any]) -> None:
    """Raise if `job` breaks its CRD's schema or the admission rules."""
    require_schemas()
    jsonschema.validate(job, schema(job["kind"]))
    errors = admission_errors(job)
    if errors:
        raise AssertionError("; ".join(errors))
