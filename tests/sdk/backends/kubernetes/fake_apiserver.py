"""A Kubernetes API server at the HTTP boundary, for the paths meshtrain's backend uses.

No API server can be installed here (test-infrastructure.md), so this answers as the real one
does for those paths: 201 with server-set metadata on create, 409 AlreadyExists, 404 NotFound and
422 Invalid as `Status` objects, lists with `items`, pod logs as text; deleting a job deletes its
pods (garbage collection). Every job posted is validated strictly against its Kubeflow CRD and
the operator's admission rules (crd.py) before it is stored.
"""

from __future__ import annotations

import json
import re
import threading
import uuid
from datetime import datetime, timezone
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any
from urllib.parse import parse_qs, urlparse

from .crd import validate

_COLLECTION = re.compile(r"^/(?:api/v1|apis/(?P<group>[^/]+)/(?P<version>[^/]+))/namespaces/"
                         r"(?P<ns>[^/]+)/(?P<plural>[^/]+)(?:/(?P<name>[^/]+))?(?P<log>/log)?$")


def _status(code: int, reason: str, message: str) -> dict[str, Any]:
    return {"kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": message, "reason": reason, "code": code}


class FakeCluster:
    """The stored objects, keyed by (plural, namespace, name), and the test's controls."""

    def __init__(self) -> None:
        self.objects: dict[tuple[str, str, str], dict[str, Any]] = {}
        self.logs: dict[tuple[str, str], str] = {}
        self.requests: list[tuple[str, str]] = []
        self.lock = threading.Lock()

    def set_conditions(self, namespace: str, name: str, *conditions: tuple[str, str]) -> None:
        """Conditions as the operator writes them: (type, message), each status "True"."""
        with self.lock:
            job = self.objects[("pytorchjobs", namespace, name)]
            job["status"] = {"startTime": "2026-11-23T10:00:00Z", "conditions": [
                {"type": kind, "status": "True", "message": message, "reason": kind}
                for kind, message in conditions]}

    def add_pod(self, namespace: str, name: str, job_name: str, log: str) -> None:
        with self.lock:
            self.objects[("pods", namespace, name)] = {
                "apiVersion": "v1", "kind": "Pod",
                "metadata": {"name": name, "namespace": namespace,
                             "labels": {"meshtrain.io/job-name": job_name}}}
            self.logs[(namespace, name)] = log


class _Handler(BaseHTTPRequestHandler):
    """One request against `cluster` (bound by FakeApiServer through a subclass)."""

    cluster: FakeCluster

    def log_message(self, *_args: Any) -> None:  # quiet test output
        pass

    def _send(self, code: int, body: Any, content_type: str = "application/json") -> None:
        data = body.encode() if isinstance(body, str) else json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def _route(self) -> tuple[Any, dict[str, list[str]]] | None:
        url = urlparse(self.path)
        self.cluster.requests.append((self.command, url.path))
        match = _COLLECTION.match(url.path)
        if match is None:
            self._send(404, _status(404, "NotFound", f"no route {url.path}"))
            return None
        return match, parse_qs(url.query)

    def do_POST(self) -> None:
        routed = self._route()
        if routed is None:
            return
        match, _ = routed
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        key = (match["plural"], match["ns"], body["metadata"]["name"])
        if match["group"]:
            try:
                validate(body)
            except Exception as error:  # the real server answers 422 Invalid
                self._send(422, _status(422, "Invalid", str(error)[:2000]))
                return
        with self.cluster.lock:
            if key in self.cluster.objects:
                self._send(409, _status(409, "AlreadyExists",
                                        f'{key[0]} "{key[2]}" already exists'))
                return
            body["metadata"].update(
                uid=str(uuid.uuid4()), resourceVersion="1", namespace=match["ns"],
                creationTimestamp=datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ"))
            self.cluster.objects[key] = body
        self._send(201, body)

    def do_GET(self) -> None:
        routed = self._route()
        if routed is None:
            return
        match, query = routed
        if match["log"]:
            log = self.cluster.logs.get((match["ns"], match["name"]))
            if log is None:
                self._send(404, _status(404, "NotFound", f'pods "{match["name"]}" not found'))
            else:
                self._send(200, log, "text/plain")
            return
        if match["name"] is None:
            wanted = dict(s.split("=", 1) for s in query.get("labelSelector", [""])[0]
                          .split(",") if s)
            items = [obj for (plural, ns, _), obj in sorted(self.cluster.objects.items())
                     if plural == match["plural"] and ns == match["ns"] and all(
                         obj["metadata"].get("labels", {}).get(k) == v
                         for k, v in wanted.items())]
            self._send(200, {"kind": "List", "apiVersion": "v1", "metadata": {},
                             "items": items})
            return
        obj = self.cluster.objects.get((match["plural"], match["ns"], match["name"]))
        if obj is None:
            self._send(404, _status(404, "NotFound",
                                    f'{match["plural"]} "{match["name"]}" not found'))
        else:
            self._send(200, obj)

    def do_DELETE(self) -> None:
        routed = self._route()
        if routed is None:
            return
        match, _ = routed
        with self.cluster.lock:
            obj = self.cluster.objects.pop((match["plural"], match["ns"], match["name"]), None)
            if obj is not None and match["group"]:  # the garbage collector takes its pods
                for key in [k for k, v in self.cluster.objects.items() if k[0] == "pods" and
                            v["metadata"]["labels"].get("meshtrain.io/job-name")
                            == match["name"]]:
                    del self.cluster.objects[key]
        if obj is None:
            self._send(404, _status(404, "NotFound",
                                    f'{match["plural"]} "{match["name"]}" not found'))
        else:
            self._send(200, {"kind": "Status", "apiVersion": "v1", "status": "Success",
                             "metadata": {}, "details": {"name": match["name"]}})



class FakeApiServer:
    """Serve a FakeCluster on 127.0.0.1 in a thread; use as a context manager."""

    def __init__(self) -> None:
        self.cluster = FakeCluster()
        handler = type("Handler", (_Handler,), {"cluster": self.cluster})
        self.server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.server.server_address[1]}"

    def __enter__(self) -> FakeApiServer:
        self.thread.start()
        return self

    def __exit__(self, *_exc: Any) -> None:
        self.server.shutdown()
        self.server.server_close()
