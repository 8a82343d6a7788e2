"""Elastic rendezvous for real: Debian's etcd (v2 API) and two hosts in two network namespaces,
each with its own hostname and /etc/hosts (test-infrastructure.md), run the pods' contract of a
rendered PyTorchJob with the PET_* variables an elasticPolicy gives them. The quickstart trains on
2 hosts x 2 processes and ends with the same loss as the local-process job.

Needs root, `ip netns`, `unshare` and etcd (`apt-get install etcd-server`); skipped with the
reason otherwise, and a failure under CI=true (tests/ci_guards.py). An etcd that does not become
healthy fails with its log. The namespaces talk only to each other over a veth pair, never to the
outside."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from ci_guards import missing_component
from test_kubernetes_pods import (
    last_loss,
    local_job_loss,
    make_pod,
    pod_environment,
    rendered_pods,
)

pytestmark = [pytest.mark.e2e, pytest.mark.multiprocess]
SUBNET = "10.231.77"
ETCD_PORT = 2379


def _missing() -> str | None:
    if os.geteuid() != 0:
        return "needs root for network namespaces"
    for tool in ("ip", "unshare", "etcd"):
        if shutil.which(tool) is None:
            return f"needs `{tool}` (etcd: apt-get install etcd-server)"
    try:
        import etcd  # noqa: F401  (torch's etcd rendezvous client)
    except ModuleNotFoundError as error:  # installed but broken: raise, not a skip
        if error.name != "etcd":
            raise
        return "needs the python-etcd package (torch's etcd-v2 rendezvous client)"
    return None


def _run(*command: str) -> None:
    subprocess.run(command, check=True, capture_output=True, text=True)


@pytest.fixture
def two_hosts(tmp_path):
    """Namespaces algo-1 and algo-2 joined by a veth pair; etcd listening in algo-1."""
    reason = _missing()
    if reason:
        missing_component(f"etcd rendezvous: {reason}")
    tag = uuid.uuid4().hex[:6]
    spaces = [f"mt-{tag}-1", f"mt-{tag}-2"]
    hosts_file = tmp_path / "hosts"
    hosts_file.write_text(f"127.0.0.1 localhost\n{SUBNET}.1 algo-1\n{SUBNET}.2 algo-2\n")
    etcd = None
    log = (tmp_path / "etcd.log").open("wb")  # etcd writes it until teardown
    try:
        for space in spaces:
            _run("ip", "netns", "add", space)
            _run("ip", "netns", "exec", space, "ip", "link", "set", "lo", "up")
        _run("ip", "link", "add", f"v{tag}a", "type", "veth", "peer", "name", f"v{tag}b")
        for index, (space, link) in enumerate(zip(spaces, ("a", "b"), strict=True), start=1):
            _run("ip", "link", "set", f"v{tag}{link}", "netns", space)
            _run("ip", "netns", "exec", space, "ip", "addr", "add", f"{SUBNET}.{index}/24",
                 "dev", f"v{tag}{link}")
            _run("ip", "netns", "exec", space, "ip", "link", "set", f"v{tag}{link}", "up")
        url = f"http://{SUBNET}.1:{ETCD_PORT}"
        etcd = subprocess.Popen(
            ["ip", "netns", "exec", spaces[0], "etcd", "--data-dir", str(tmp_path / "etcd"),
             "--enable-v2=true", "--listen-client-urls", url, "--advertise-client-urls", url,
             "--listen-peer-urls", "http://127.0.0.1:2380"],
            stdout=log, stderr=subprocess.STDOUT)
        _wait_for_etcd(spaces[0], url, etcd, tmp_path / "etcd.log")
        yield spaces, hosts_file
    finally:
        if etcd is not None:
            etcd.terminate()
            etcd.wait(timeout=30)
        log.close()
        for space in spaces:
            subprocess.run(["ip", "netns", "del", space], capture_output=True)


def _wait_for_etcd(space: str, url: str, etcd: subprocess.Popen, log: Path) -> None:
    """etcd answers its health check within 30 s, or the test fails with etcd's log."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline and etcd.poll() is None:
        probe = subprocess.run(["ip", "netns", "exec", space, "etcdctl", "--endpoints", url,
                                "endpoint", "health"], capture_output=True)
        if probe.returncode == 0:
            return
        time.sleep(0.3)
    tail = log.read_text(errors="replace")[-3000:]
    pytest.fail(f"etcd did not become healthy (exit {etcd.poll()}); its log:\n{tail}",
                pytrace=False)


def _etcd_v2_keys(space: str, url: str) -> list[str]:
    """Every key of etcd's v2 store, read from inside the namespace that serves it."""
    read = ("import urllib.request, sys; sys.stdout.write(urllib.request.urlopen("
            f"'{url}/v2/keys/?recursive=true', timeout=10).read().decode())")
    listing = json.loads(subprocess.run(["ip", "netns", "exec", space, sys.executable, "-c", read],
                                        check=True, capture_output=True, text=True).stdout)
    keys, nodes = [], [listing["node"]]
    while nodes:
        node = nodes.pop()
        keys.append(node.get("key", "/"))
        nodes.extend(node.get("nodes", []))
    return keys


def _in_host(space: str, hostname: str, hosts_file: Path, command: list[str]) -> list[str]:
    """`command` inside `space` with its own hostname and /etc/hosts."""
    inner = (f"mount --bind {hosts_file} /etc/hosts && hostname {hostname} && exec "
             + " ".join(command))
    return ["ip", "netns", "exec", space, "unshare", "--mount", "--uts", "sh", "-c", inner]


def test_etcd_rendezvous_across_two_namespaces_matches_the_local_job(two_hosts, tmp_path):
    spaces, hosts_file = two_hosts
    expected = local_job_loss(tmp_path / "jobs")
    config_map, container, code = rendered_pods("elastic")
    pods = []
    for index, replica in enumerate((("master", "0"), ("worker", "0"))):
        base = make_pod(tmp_path, f"host-{index + 1}", config_map, code)
        env = pod_environment(container, base, replica, port=0)
        env.pop("MESHTRAIN_MASTER_ADDR")  # elastic: the rendezvous decides the master
        env.pop("MESHTRAIN_MASTER_PORT")
        env.update(PET_RDZV_BACKEND="etcd-v2", PET_RDZV_ENDPOINT=f"algo-1:{ETCD_PORT}",
                   PET_NNODES="2", PET_RDZV_ID="elastic-test", MESHTRAIN_RDZV_WAIT_SECONDS="30")
        command = _in_host(spaces[index], f"algo-{index + 1}", hosts_file,
                           [sys.executable, "-m", "meshtrain_runtime.host.bootstrap"])
        pods.append(subprocess.Popen(command, cwd=tmp_path, env=env, text=True,
                                     stdout=subprocess.PIPE, stderr=subprocess.STDOUT))
    outputs = [pod.communicate(timeout=300)[0] for pod in pods]
    assert [pod.returncode for pod in pods] == [0, 0], outputs
    losses = [last_loss(out.splitlines()) for out in outputs if "train:loss" in out]
    assert len(losses) == 1  # rank 0 prints; the rendezvous chose which host holds it
    assert losses[0] == pytest.approx(expected, abs=1e-5)
    # the hosts met in etcd (a static rendezvous would have left nothing there)
    keys = _etcd_v2_keys(spaces[0], f"http://{SUBNET}.1:{ETCD_PORT}")
    assert any(key.startswith("/torch/elastic") and "elastic-test" in key for key in keys), keys
