"""Runs notebook cells with the real SageMaker SDK v3, in its own environment (a subprocess).

``python sdk_cells_runner.py <cells.json>``: {"prelude": ..., "namespace": {...},
"cells": {name: code}}. Each cell runs in a fresh namespace; one JSON line per cell says
whether it raised. The requests go to whatever AWS_ENDPOINT_URL names (moto, in the tests).
"""

import json
import sys
import traceback
import warnings

warnings.simplefilter("ignore")  # the SDK's deprecation notes (sagemaker.train.configs)


def main() -> None:
    with open(sys.argv[1]) as handle:
        given = json.load(handle)
    for name, code in given["cells"].items():
        namespace = dict(given["namespace"])
        try:
            exec(compile(given["prelude"] + code, name, "exec"), namespace)
            print(json.dumps({"cell": name, "error": None}), flush=True)
        except Exception as error:
            print(json.dumps({"cell": name, "error": f"{type(error).__name__}: {error}",
                              "traceback": traceback.format_exc()[-3000:]}), flush=True)


if __name__ == "__main__":
    main()
