"""Runs notebook cells with the real SageMaker SDK v3, in its own environment (a subprocess).

``python sdk_cells_runner.py <cells.json>``: {"prelude": ..., "namespace": {...},
"cells": {name: code}}. Each cell runs in a fresh namespace; one JSON line per cell says
whether it raised. Every AWS client the SDK makes talks to AWS_ENDPOINT_URL (moto, in the
tests): the SDK names STS's regional endpoint explicitly, which boto3's own setting would not
override, so the endpoint is set where clients are created. Nothing else of the SDK is touched.
"""

import json
import os
import sys
import traceback
import warnings

import botocore.session

warnings.simplefilter("ignore")  # the SDK's deprecation notes (sagemaker.train.configs)


def every_client_to(endpoint: str) -> None:
    create_client = botocore.session.Session.create_client

    def to_endpoint(self, *args, **kwargs):
        kwargs["endpoint_url"] = endpoint
        return create_client(self, *args, **kwargs)

    botocore.session.Session.create_client = to_endpoint


def main() -> None:
    if os.environ.get("AWS_ENDPOINT_URL"):
        every_client_to(os.environ["AWS_ENDPOINT_URL"])
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
