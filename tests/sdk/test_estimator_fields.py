"""The job fields are declared once: every JobSpec field is either one the Estimator takes and
keeps under the same name, or one set another way; build_spec() and from_spec() use that list."""

from __future__ import annotations

import inspect

from meshtrain import Estimator
from meshtrain.contract.jobspec import JobSpec
from meshtrain.estimator import SHARED_FIELDS, SPEC_ONLY_FIELDS


def test_every_jobspec_field_is_classified_once():
    assert sorted((*SHARED_FIELDS, *SPEC_ONLY_FIELDS)) == sorted(JobSpec.model_fields)
    assert not set(SHARED_FIELDS) & set(SPEC_ONLY_FIELDS)


def test_every_shared_field_is_an_estimator_argument():
    parameters = inspect.signature(Estimator.__init__).parameters
    assert set(SHARED_FIELDS) <= set(parameters)


def test_from_spec_rebuilds_an_estimator_with_the_same_spec(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("print('x')\n")
    original = Estimator("train.py", source_dir=str(src), instance_count=2, max_run=600,
                         hyperparameters={"lr": 0.1}, environment={"A": "1"},
                         tags=[{"Key": "team", "Value": "ml"}], container_log_level=10,
                         distribution={"torch_distributed": {"enabled": True,
                                                             "processes_per_host": 2}})
    spec = original.build_spec(job_name="same")
    assert Estimator.from_spec(spec).build_spec(job_name="same") == spec
    script_only = Estimator(str(src / "train.py")).build_spec(job_name="script")
    assert Estimator.from_spec(script_only).build_spec(job_name="script") == script_only
