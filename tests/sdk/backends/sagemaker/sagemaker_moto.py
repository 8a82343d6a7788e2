"""moto as a real HTTP server on 127.0.0.1 that logs every request it receives (test helpers).

boto3 reaches it through AWS_ENDPOINT_URL (boto3's own setting; meshtrain passes no endpoint).
The server runs in this process, so tests drive job status through moto's backend objects.
"""

from __future__ import annotations

import io
import json
import threading
import urllib.request
from dataclasses import dataclass
from typing import Any

from moto.moto_server.threaded_moto_server import ThreadedMotoServer
from moto.moto_server.werkzeug_app import DomainDispatcherApplication, create_backend_app
from werkzeug.serving import make_server

ACCOUNT = "123456789012"  # moto's default account
REGION = "us-west-2"
ROLE = f"arn:aws:iam::{ACCOUNT}:role/SageMakerRole"
DEFAULT_BUCKET = f"sagemaker-{REGION}-{ACCOUNT}"


@dataclass(frozen=True)
class Request:
    """One HTTP request as moto received it."""

    method: str
    path: str
    target: str | None
    headers: dict[str, str]
    body: bytes

    @property
    def operation(self) -> str:
        """'SageMaker.CreateTrainingJob', 'Logs_20140328.GetLogEvents', or 'S3 PUT /b/k'."""
        if self.target:
            return self.target
        if self.body.startswith(b"Action="):
            return self.body.decode().split("&")[0].removeprefix("Action=")
        return f"S3 {self.method} {self.path}"

    def json(self) -> Any:
        return json.loads(self.body)


class RecordingMotoServer(ThreadedMotoServer):
    """ThreadedMotoServer whose WSGI app is wrapped to record each request before moto sees it."""

    def __init__(self) -> None:
        super().__init__(ip_address="127.0.0.1", port=0, verbose=False)
        self.requests: list[Request] = []
        self._lock = threading.Lock()

    def _record(self, app: Any) -> Any:
        def recording_app(environ: dict, start_response: Any) -> Any:
            if environ.get("CONTENT_LENGTH"):
                body = environ["wsgi.input"].read(int(environ["CONTENT_LENGTH"]))
            elif environ.get("wsgi.input_terminated"):
                body = environ["wsgi.input"].read()
            else:
                body = b""
            environ["wsgi.input"] = io.BytesIO(body)
            headers = {k[5:].replace("_", "-").lower(): v for k, v in environ.items()
                       if k.startswith("HTTP_")}
            if not environ.get("PATH_INFO", "").startswith("/moto-api"):
                with self._lock:
                    self.requests.append(Request(environ["REQUEST_METHOD"], environ["PATH_INFO"],
                                                 headers.get("x-amz-target"), headers, body))
            return app(environ, start_response)

        return recording_app

    def _server_entry(self) -> None:
        app = self._record(DomainDispatcherApplication(create_backend_app))
        self._server = make_server(self._ip_address, self._port, app, True)
        self._server_ready_event.set()
        self._server.serve_forever()

    @property
    def url(self) -> str:
        host, port = self.get_host_and_port()
        return f"http://{host}:{port}"

    def operations(self) -> list[str]:
        return [request.operation for request in self.requests]

    def find(self, operation: str) -> list[Request]:
        return [request for request in self.requests if request.operation == operation]

    def reset(self) -> None:
        urllib.request.urlopen(urllib.request.Request(f"{self.url}/moto-api/reset",
                                                      method="POST"), timeout=30).read()
        with self._lock:
            self.requests.clear()


def point_boto3_at(server: RecordingMotoServer, monkeypatch: Any, tmp_path: Any) -> None:
    """An environment whose only AWS configuration points boto3 at `server`."""
    for name in ("AWS_PROFILE", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN", "AWS_REGION",
                 "AWS_ROLE_ARN", "AWS_WEB_IDENTITY_TOKEN_FILE",
                 "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", REGION)
    monkeypatch.setenv("AWS_ENDPOINT_URL", server.url)


def sagemaker_backend(region: str = REGION) -> Any:
    """moto's in-process SageMaker backend (the server runs in this process)."""
    from moto.sagemaker.models import sagemaker_backends

    return sagemaker_backends[ACCOUNT][region]
