"""targets.py is the one reader of instance_type: kinds, GPUs per host, backend options."""

from __future__ import annotations

import pytest

from meshtrain.backends.kubernetes.backend import KubernetesBackend
from meshtrain.backends.local import LocalBackend
from meshtrain.backends.sagemaker import SageMakerBackend
from meshtrain.errors import ConfigError
from meshtrain.targets import TARGET_KINDS, known_options, local_gpu_count, resolve_target


@pytest.mark.parametrize("instance_type, kind, gpus", [
    ("local", "local", 0), ("ml.p4d.24xlarge", "sagemaker", 8), ("ml.g5.12xlarge", "sagemaker", 4),
    ("ml.m5.xlarge", "sagemaker", 0), ("ml.p5.48xlarge", "sagemaker", 8),
    ("k8s:ml.p4d.24xlarge", "kubernetes", 8), ("k8s:ml.m5.xlarge", "kubernetes", 0),
])
def test_each_instance_type_resolves_to_its_kind_and_gpus(instance_type, kind, gpus):
    target = resolve_target(instance_type)
    assert (target.name, target.gpus_per_host, target.instance_type) == (kind, gpus,
                                                                         instance_type)


def test_local_gpu_counts_this_machines_gpus_and_runs_one_host():
    target = resolve_target("local_gpu")
    assert target.gpus_per_host == local_gpu_count()
    assert target.kind.max_hosts == 1 and target.on_this_machine


@pytest.mark.parametrize("instance_type, hint", [
    ("locl", "Did you mean 'local'?"), ("gpu", ""), ("ml.p4d.24xlarg", "ml.p4d.24xlarge"),
])
def test_unknown_instance_types_are_config_errors_with_a_fix(instance_type, hint):
    with pytest.raises(ConfigError) as error:
        resolve_target(instance_type)
    assert instance_type in str(error.value) and hint in str(error.value)


@pytest.mark.parametrize("value", [None, "", 3, ["local"]])
def test_instance_type_must_be_a_non_empty_string(value):
    with pytest.raises(ConfigError, match="instance_type must be a string"):
        resolve_target(value)


def test_every_kind_names_its_backend_class_and_options(tmp_path):
    assert isinstance(resolve_target("local").backend(jobs_dir=tmp_path), LocalBackend)
    assert isinstance(resolve_target("ml.m5.xlarge").backend(), SageMakerBackend)
    assert isinstance(resolve_target("k8s:ml.m5.xlarge").backend(namespace="team"),
                      KubernetesBackend)
    assert resolve_target("k8s:ml.p5.48xlarge").hardware_type == "ml.p5.48xlarge"
    assert resolve_target("local").options == frozenset({"jobs_dir"})
    assert {"sagemaker_session", "subnets"} <= resolve_target("ml.m5.xlarge").options
    assert known_options() == frozenset().union(*(k.options() for k in TARGET_KINDS))


def test_no_two_kinds_claim_the_same_instance_type():
    for instance_type in ("local", "local_gpu", "ml.p4d.24xlarge", "ml.m5.xlarge",
                          "k8s:ml.p5.48xlarge"):
        claims = [kind.name for kind in TARGET_KINDS if kind.matches(instance_type)]
        assert len(claims) == 1, (instance_type, claims)


def test_each_backend_declares_its_option_names_once_and_its_constructor_takes_them():
    """targets.py reads each backend's own OPTIONS; a constructor keyword it does not declare
    (or a declared name the constructor ignores) would be a second, drifting list."""
    import inspect

    from meshtrain.targets import _declared, backend_kinds

    for kind in backend_kinds():
        backend_class = _declared(kind.backend_class)
        parameters = inspect.signature(backend_class.__init__).parameters
        named = {name for name, p in parameters.items() if name not in ("self", "target")
                 and p.kind is not inspect.Parameter.VAR_KEYWORD}
        assert "target" in parameters, kind.name  # every backend is made with its Target
        if named:  # SageMaker takes **options and checks them against its own OPTION_NAMES
            assert named == set(kind.options()), kind.name
