"""Hyperparameters: SageMaker SDK v2 encoding and the training toolkit's CLI rendering."""

from __future__ import annotations

from meshtrain.contract import (
    decode_hyperparameters,
    encode_hyperparameters,
    split_hyperparameters,
    to_cmd_args,
)
from meshtrain.contract.hyperparameters import env_value

VALUES = {"lr": 0.001, "epochs": 3, "name": "llama", "flag": True, "off": False,
          "layers": [1, 2], "cfg": {"b": 2, "a": "x"}, "n": None}


def test_encoding_is_json_text_like_the_sdk():
    assert encode_hyperparameters(VALUES) == {
        "lr": "0.001", "epochs": "3", "name": '"llama"', "flag": "true", "off": "false",
        "layers": "[1, 2]", "cfg": '{"b": 2, "a": "x"}', "n": "null",
    }


def test_decoding_round_trips_and_keeps_raw_text():
    assert decode_hyperparameters(encode_hyperparameters(VALUES)) == VALUES
    assert decode_hyperparameters({"raw": "not json"}) == {"raw": "not json"}


def test_cli_args_sorted_with_toolkit_rendering():
    assert to_cmd_args({**VALUES, "x": 1}) == [
        "--cfg", "a=x,b=2", "--epochs", "3", "--flag", "True", "--layers", "[1, 2]",
        "--lr", "0.001", "-n", "None", "--name", "llama", "--off", "False", "-x", "1",
    ]


def test_mp_parameters_render_as_key_value_pairs():
    args = to_cmd_args({"mp_parameters": {"tensor_parallel_degree": 1, "hybrid_shard_degree": 16}})
    assert args == ["--mp_parameters", "hybrid_shard_degree=16,tensor_parallel_degree=1"]


def test_split_reserved_framework_and_user_keys():
    reserved, framework, user = split_hyperparameters({
        "sagemaker_program": "train.py", "sagemaker_torch_distributed_enabled": True,
        "mp_parameters": {"a": 1}, "lr": 1})
    assert reserved == {"sagemaker_program": "train.py"}
    assert framework == {"sagemaker_torch_distributed_enabled": True}
    assert user == {"mp_parameters": {"a": 1}, "lr": 1}


def test_env_values_strings_raw_others_compact_json():
    assert env_value("abc") == "abc"
    assert env_value({"b": 1, "a": [1, 2]}) == '{"a":[1,2],"b":1}'
    assert env_value(True) == "true"
