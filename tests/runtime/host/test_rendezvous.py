"""Static or elastic rendezvous from the host's environment, and waiting for a peer's name."""

from __future__ import annotations

import pytest

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.host.rendezvous import (
    RendezvousError,
    elastic_arguments,
    endpoint_host,
    wait_until_resolvable,
)


def test_no_backend_is_a_static_rendezvous():
    assert elastic_arguments({}, "job", 2) is None
    assert elastic_arguments({"PET_RDZV_BACKEND": "static"}, "job", 2) is None
    assert endpoint_host(None, "algo-1") == "algo-1"


def test_an_elastic_policy_becomes_torchruns_rendezvous_arguments():
    env = {"PET_RDZV_BACKEND": "etcd-v2", "PET_RDZV_ENDPOINT": "etcd.kube:2379",
           "PET_NNODES": "2:4", "PET_MAX_RESTARTS": "3"}
    arguments = elastic_arguments(env, "llama", 4)
    assert arguments == ["--rdzv-backend", "etcd-v2", "--rdzv-endpoint", "etcd.kube:2379",
                         "--rdzv-id", "llama", "--nnodes", "2:4", "--max-restarts", "3"]
    assert endpoint_host(arguments, "algo-1") == "etcd.kube"
    c10d = elastic_arguments({"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "job-master-0"},
                             "job", 2)
    assert c10d[c10d.index("--nnodes") + 1] == "2" and endpoint_host(c10d, "x") == "job-master-0"


def test_a_restarted_local_attempt_meets_under_a_fresh_rendezvous_id():
    env = {"PET_RDZV_BACKEND": "c10d", "PET_RDZV_ENDPOINT": "algo-1:29400"}
    ids = [elastic_arguments({**env, "MESHTRAIN_ATTEMPT": attempt}, "job", 2)
           for attempt in ("1", "2", "3")]
    assert [a[a.index("--rdzv-id") + 1] for a in ids] == ["job", "job-attempt-2",
                                                           "job-attempt-3"]


@pytest.mark.parametrize("env, message", [
    ({"PET_RDZV_BACKEND": "zookeeper", "PET_RDZV_ENDPOINT": "zk:2181"}, "zookeeper"),
    ({"PET_RDZV_BACKEND": "etcd"}, "PET_RDZV_ENDPOINT"),
])
def test_an_unusable_rendezvous_is_a_config_error(env, message):
    with pytest.raises(ConfigError, match=message):
        elastic_arguments(env, "job", 2)


def test_waits_for_a_name_that_appears_late():
    clock = {"now": 0.0}
    answers = iter([OSError("Name or service not known")] * 3 + ["10.0.0.7"])

    def resolve(_host):
        answer = next(answers)
        if isinstance(answer, Exception):
            raise answer
        return answer

    def sleep(seconds):
        clock["now"] += seconds

    wait_until_resolvable("job-master-0", seconds=10, resolve=resolve, sleep=sleep,
                          clock=lambda: clock["now"])
    assert clock["now"] == 3.0


def test_gives_up_after_the_deadline_naming_the_host():
    clock = {"now": 0.0}

    def never(_host):
        raise OSError("Name or service not known")

    def sleep(seconds):
        clock["now"] += seconds

    with pytest.raises(RendezvousError, match="'job-master-0' did not resolve within 5 s"):
        wait_until_resolvable("job-master-0", seconds=5, resolve=never, sleep=sleep,
                              clock=lambda: clock["now"])
