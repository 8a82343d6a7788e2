"""`meshtrain run --hyperparameters`: KEY=VALUE pairs read as the host reads them, or JSON."""

from __future__ import annotations

import pytest

from meshtrain import ConfigError
from meshtrain.cli import _merged_hyperparameters, build_parser, main
from meshtrain.contract.hyperparameters import decode_hyperparameters, encode_hyperparameters


def hyperparameters(*given: str) -> dict:
    args = build_parser().parse_args(["run", "train.py", "--hyperparameters", *given])
    return _merged_hyperparameters(args.hyperparameters)


def test_key_value_pairs_get_the_types_the_sagemaker_sdk_round_trip_gives():
    parsed = hyperparameters("steps=3", "lr=0.1", "name=llama", "flag=true", "ids=[1,2]",
                             'cfg={"a":1}', "empty=", "eq=a=b")
    assert parsed == {"steps": 3, "lr": 0.1, "name": "llama", "flag": True, "ids": [1, 2],
                      "cfg": {"a": 1}, "empty": "", "eq": "a=b"}
    assert type(parsed["steps"]) is int and type(parsed["lr"]) is float
    # what the job receives equals what the SDK sends for the same Python dict and decodes again
    python = {"steps": 3, "lr": 0.1, "name": "llama", "flag": True, "ids": [1, 2],
              "cfg": {"a": 1}, "empty": "", "eq": "a=b"}
    assert encode_hyperparameters(parsed) == encode_hyperparameters(python)
    assert decode_hyperparameters(encode_hyperparameters(parsed)) == python


def test_json_is_still_accepted_alone_or_with_pairs():
    assert hyperparameters('{"steps": 3, "lr": 0.1}') == {"steps": 3, "lr": 0.1}
    assert hyperparameters('{"steps": 3}', "lr=0.1") == {"steps": 3, "lr": 0.1}
    args = build_parser().parse_args(["run", "train.py", "--hyperparameters", "steps=3",
                                      "--hyperparameters", "lr=0.1"])
    assert _merged_hyperparameters(args.hyperparameters) == {"steps": 3, "lr": 0.1}
    assert build_parser().parse_args(["run", "train.py"]).hyperparameters == []


def test_a_key_given_twice_with_two_values_is_refused():
    with pytest.raises(ConfigError, match=r"gives 'steps' twice \(3 and 4\)"):
        hyperparameters("steps=3", "steps=4")
    assert hyperparameters("steps=3", '{"steps": 3}') == {"steps": 3}


@pytest.mark.parametrize("argv", [
    ["run", "--hyperparameters", "steps=3", "train.py"],  # the entry point eaten as a pair
    ["run", "train.py", "--hyperparameters", "steps"],
    ["run", "train.py", "--hyperparameters", "=3"],
])
def test_what_is_not_a_pair_is_a_usage_error_that_says_the_form(argv, capsys):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert "expected KEY=VALUE (e.g. steps=3 lr=0.1) or a JSON object" in err
    assert "Traceback" not in err


def test_the_help_explains_the_option(capsys):
    with pytest.raises(SystemExit):
        build_parser().parse_args(["run", "--help"])
    out = " ".join(capsys.readouterr().out.split())
    assert "--hyperparameters KEY=VALUE [KEY=VALUE ...]" in out
    assert "steps=3 is the int 3, lr=0.1 a float" in out
