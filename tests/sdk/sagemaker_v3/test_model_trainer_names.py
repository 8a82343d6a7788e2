"""meshtrain.sagemaker.train has SDK v3's names: every config class of sagemaker.train.configs,
Torchrun / SMP / MPI and ModelTrainer, with the same fields in the same order and the same
defaults, read from the real sagemaker==3.27.0 (its own environment, a subprocess)."""

from __future__ import annotations

import json
import subprocess

import pytest
from sdk_v3_env import sdk_environment, sdk_python

pytestmark = pytest.mark.multiprocess  # the SDK runs in a process (and environment) of its own

DESCRIBE = '''
import json, warnings
warnings.simplefilter("ignore")
import pydantic
import pydantic_core


def default(info):
    if info.default_factory is not None:
        value = info.default_factory()
    elif info.default is pydantic_core.PydanticUndefined:
        return "<required>"
    else:
        value = info.default
    if type(value).__name__ == "Unassigned":
        return None
    value = value.value if hasattr(value, "value") else value
    try:
        json.dumps(value)
    except TypeError:
        return f"<{type(value).__name__}>"
    return value


def describe(package):
    configs = __import__(f"{package}.train.configs", fromlist=["__all__"])
    distributed = __import__(f"{package}.train.distributed", fromlist=["SMP"])
    trainer = __import__(f"{package}.train.model_trainer", fromlist=["ModelTrainer"])
    classes = {name: value for name, value in vars(configs).items()
               if not name.startswith("_") and isinstance(value, type)
               and issubclass(value, pydantic.BaseModel)}
    names = sorted(classes)
    classes.update(SMP=distributed.SMP, Torchrun=distributed.Torchrun, MPI=distributed.MPI,
                   ModelTrainer=trainer.ModelTrainer)
    return {"configs": names,
            "modes": [mode.value for mode in trainer.Mode],
            "fields": {name: [[field, default(info)] for field, info in cls.model_fields.items()]
                       for name, cls in classes.items()}}
'''


@pytest.fixture(scope="module")
def sdk_names(tmp_path_factory):
    root = tmp_path_factory.mktemp("sdk-names")
    done = subprocess.run(
        [str(sdk_python()), "-c", DESCRIBE + "print(json.dumps(describe('sagemaker')))"],
        env=sdk_environment({"PATH": "/usr/bin:/bin", "HOME": str(root)}, root), cwd=root,
        capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.splitlines()[-1]), root


def ours(cwd):
    namespace: dict = {}
    exec(DESCRIBE, namespace)  # the same description of meshtrain's classes
    import os

    here = os.getcwd()
    os.chdir(cwd)  # ModelTrainer.local_container_root defaults to the working directory
    try:
        return json.loads(json.dumps(namespace["describe"]("meshtrain.sagemaker")))
    finally:
        os.chdir(here)


def test_every_config_class_and_mode(sdk_names):
    sdk, root = sdk_names
    mine = ours(root)
    assert mine["configs"] == sdk["configs"]
    assert mine["modes"] == sdk["modes"]


def test_same_fields_in_the_same_order_with_the_same_defaults(sdk_names):
    sdk, root = sdk_names
    mine = ours(root)["fields"]
    for name, fields in sdk["fields"].items():
        if name == "SMP":  # the SDK's nine first, meshtrain's parameters after them
            assert mine[name][:len(fields)] == fields
            assert all(default is None for _, default in mine[name][len(fields):])
        elif name == "ModelTrainer":  # meshtrain's backend_options after the SDK's fields
            # config_mgr is the SDK's reader of SageMaker config files (defaults from
            # ~/.config/sagemaker), which meshtrain does not read (docs/sagemaker-v3.md)
            fields = [field for field in fields if field[0] != "config_mgr"]
            assert mine[name][:len(fields)] == fields
            assert [field for field, _ in mine[name][len(fields):]] == ["backend_options"]
        else:
            assert mine[name] == fields, name
