"""Issue 43 in the client, without a job: the file-permission policy (contract/private_files.py),
environment values kept out of the records (contract/job_environment.py), a job's processes
recognised by token and owner, another user's stop refused, the addresses services bind
(contract/network.py), and what the Docker and Slurm backends hand their engines."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import tarfile
import time
from pathlib import Path

import pytest

from meshtrain import ConfigError, Estimator
from meshtrain.backends.docker.containers import DockerSettings, run_command, user_arguments
from meshtrain.backends.hosts.backend import HostBackend, readable
from meshtrain.backends.hosts.job import HostTrainingJob
from meshtrain.backends.hosts.layout import JobDirectory
from meshtrain.backends.hosts.lighthouse import Lighthouse
from meshtrain.backends.hosts.processes import carries_token, pids_of_job
from meshtrain.backends.hosts.supervisor import HostSupervisor
from meshtrain.backends.local.supervisor import host_environment as local_host_environment
from meshtrain.backends.slurm import node as slurm_node
from meshtrain.backends.slurm.batch import hosts_reason
from meshtrain.backends.slurm.script import SlurmOptions, render
from meshtrain.contract import job_environment
from meshtrain.contract.archive import safe_extract
from meshtrain.contract.jobspec import JobSpec
from meshtrain.contract.network import local_address_towards, service_address, url_host
from meshtrain.contract.private_files import (
    check_owned,
    home_warning,
    make_private_dir,
    private_umask,
    restrict_umask,
    write_private_text,
)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


@pytest.fixture
def loose_umask():
    previous = os.umask(0o022)
    yield
    os.umask(previous)


def test_private_directories_and_files_are_owner_only_under_a_loose_umask(tmp_path,
                                                                          loose_umask):
    made = tmp_path / "a" / "b"
    assert make_private_dir(made, parents=True) is True
    assert mode(made) == mode(made.parent) == 0o700
    assert make_private_dir(made) is False  # an existing one is left as it is
    old = tmp_path / "old.json"
    old.write_text("{}")
    assert mode(old) == 0o644
    write_private_text(old, "{\"new\": 1}")  # tightened before its new content is written
    assert mode(old) == 0o600 and old.read_text() == "{\"new\": 1}"
    with private_umask():
        (tmp_path / "inside").write_text("x")
        (tmp_path / "inside-dir").mkdir()
    (tmp_path / "after").write_text("x")
    assert mode(tmp_path / "inside") == 0o600 and mode(tmp_path / "inside-dir") == 0o700
    assert mode(tmp_path / "after") == 0o644  # the caller's umask is back


def test_restrict_umask_only_ever_tightens(loose_umask):
    restrict_umask()
    assert os.umask(0o022) == 0o077
    os.umask(0o027)
    restrict_umask()
    assert os.umask(0o022) == 0o077


def test_an_open_meshtrain_home_gets_one_warning_line(tmp_path):
    home = tmp_path / "home"
    home.mkdir(mode=0o700)
    home.chmod(0o700)
    assert home_warning(home) is None
    home.chmod(0o755)
    warning = home_warning(home)
    assert warning == (f"MESHTRAIN_HOME {home} is open to other users (mode 0755); new jobs are "
                       f"private, but jobs made before may not be: run `chmod 700 {home}`.")


def test_submit_makes_meshtrain_home_private_and_warns_when_it_is_open(tmp_path, monkeypatch,
                                                                       capsys, loose_umask):
    home = tmp_path / "home"
    monkeypatch.setenv("MESHTRAIN_HOME", str(home))
    backend = HostBackend()
    backend._make_jobs_dir()
    assert mode(home) == mode(home / "jobs") == 0o700
    assert capsys.readouterr().err == ""
    home.chmod(0o755)
    backend._make_jobs_dir()
    err = capsys.readouterr().err.splitlines()
    assert len(err) == 1 and err[0].startswith("meshtrain: warning: MESHTRAIN_HOME ")


def test_extracted_code_is_owner_only(tmp_path, loose_umask):
    source = tmp_path / "src"
    source.mkdir()
    (source / "train.py").write_text("print(1)")
    tarball = tmp_path / "code.tar.gz"
    with tarfile.open(tarball, "w:gz") as tar:
        tar.add(source / "train.py", arcname="pkg/train.py")
    target = tmp_path / "code"
    safe_extract(tarball, target)
    assert mode(target / "pkg") & 0o077 == 0 and mode(target / "pkg" / "train.py") == 0o600


SPEC = JobSpec(job_name="j", entry_point="train.py", source_dir="/src",
               environment={"HF_TOKEN": "hf_secret_value", "N": "1"})


def test_spec_json_masks_the_environment_and_the_job_gets_it_back():
    record = SPEC.to_record_json()
    assert "hf_secret_value" not in record
    masked = JobSpec.from_json(record)
    assert masked.environment == {"HF_TOKEN": "<masked>", "N": "<masked>"}
    process_env = {job_environment.MESHTRAIN_JOB_ENVIRONMENT:
                   job_environment.encode(SPEC.environment)}
    assert masked.with_environment_from(process_env).environment == SPEC.environment
    with pytest.raises(ConfigError) as missing:
        masked.with_environment_from({})
    assert "HF_TOKEN, N did not reach this process" in str(missing.value)
    assert str(missing.value).endswith("--export=ALL.") and not str(missing.value).endswith("..")


def test_a_failure_reason_never_keeps_an_environment_value():
    reason = "KeyError: 'hf_secret_value' while reading N=1"
    assert job_environment.scrub(reason, SPEC.environment) == (
        "KeyError: '<masked>' while reading N=1")  # one character is too short to mask


def test_an_attached_estimator_must_be_given_its_values_again():
    estimator = Estimator(__file__, environment={"HF_TOKEN": "<masked>"})
    with pytest.raises(ConfigError) as masked:
        estimator.build_spec()
    assert str(masked.value) == (
        "environment values of HF_TOKEN are '<masked>': this Estimator was rebuilt from a "
        "job's records (attach), which keep no environment values. Set them again "
        "(estimator.environment['HF_TOKEN'] = ...) before fit().")


def test_another_users_job_cannot_be_stopped_or_removed(tmp_path, monkeypatch):
    job_dir = tmp_path / "jobs" / "theirs"
    job_dir.mkdir(parents=True)
    owner = job_dir.stat().st_uid
    monkeypatch.setattr(os, "getuid", lambda: owner + 1)
    job = HostTrainingJob("theirs", JobDirectory(job_dir))
    for action in (job.stop, job.end_leftover_processes):
        with pytest.raises(ConfigError) as refused:
            action()
        assert "job theirs belongs to " in str(refused.value)
        assert str(refused.value).endswith("only its owner can stop it. Run the command as "
                                           "that user.")
    with pytest.raises(ConfigError, match="only its owner can remove it"):
        check_owned(job_dir, "job theirs", "remove")
    assert job_dir.is_dir()


def test_a_permission_error_reading_jobs_is_one_clear_line(tmp_path):
    with pytest.raises(ConfigError) as refused, readable(tmp_path):
        raise PermissionError(13, "Permission denied", str(tmp_path / "x" / "spec.json"))
    assert str(refused.value) == (
        f"cannot read {tmp_path}/x/spec.json: permission denied. A job's files are its "
        f"owner's alone: run meshtrain as the user who made the jobs under {tmp_path}.")


def test_a_process_is_the_jobs_only_with_its_token_and_its_owner():
    token = "t" * 32
    sleeper = subprocess.Popen(["sleep", "30"], env={**os.environ,
                                                     "MESHTRAIN_JOB_TOKEN": token})
    try:
        deadline = time.monotonic() + 10
        while not carries_token(sleeper.pid, token) and time.monotonic() < deadline:
            time.sleep(0.05)  # until it has exec'd with its environment
        assert carries_token(sleeper.pid, token)
        assert not carries_token(sleeper.pid, token, uid=os.getuid() + 1)
        assert not carries_token(sleeper.pid, "u" * 32)
        assert pids_of_job(token) == [sleeper.pid]
        assert pids_of_job(token, uid=os.getuid() + 1) == []
    finally:
        sleeper.kill()
        sleeper.wait()


def test_services_bind_loopback_for_a_loopback_master():
    assert local_address_towards("127.0.0.1") == "127.0.0.1"
    assert service_address("127.0.0.1") == "127.0.0.1"
    # a name that resolves to loopback here may not on the other hosts: every interface
    assert service_address("localhost") is None
    assert url_host("::1") == "[::1]" and url_host("10.0.0.2") == "10.0.0.2"


def test_the_lighthouse_binds_loopback_unless_told_otherwise(tmp_path):
    argv = Lighthouse(tmp_path / "lighthouse.log").argv()
    assert argv[argv.index("--bind") + 1] == "127.0.0.1:0"
    argv = Lighthouse(tmp_path / "l.log", bind_host="10.1.2.3").argv()
    assert argv[argv.index("--bind") + 1] == "10.1.2.3:0"


def test_docker_gets_secrets_by_name_and_runs_as_the_owner(tmp_path):
    settings = DockerSettings(job_name="j", token="t" * 32, image="img", network="net",
                              shm_size=1 << 30, user="1000:1000")
    argv = run_command(settings, "algo-1", tmp_path / "opt", tmp_path / "work",
                       {"HF_TOKEN": "hf_secret_value", "N": "1"},
                       by_name=frozenset({"HF_TOKEN"}))
    assert "hf_secret_value" not in " ".join(argv)
    assert argv[argv.index("HF_TOKEN") - 1] == "--env" and "N=1" in argv
    assert argv[argv.index("--user") + 1] == "1000:1000"
    assert user_arguments("0:0") == ["--user", "0:0"]  # root: the image's HOME is fine
    assert user_arguments("") == []  # a job made before: the image's own user


def test_the_slurm_script_sets_umask_077_and_carries_values_only_when_rendered(tmp_path):
    job_dir = JobDirectory(tmp_path / "j")
    spec = SPEC.model_copy(update={"instance_type": "slurm"})
    fitted = render(spec, job_dir, "t" * 32, SlurmOptions())
    assert "umask 077  # the job's files are its owner's alone" in fitted.splitlines()
    assert "hf_secret_value" not in fitted and "MESHTRAIN_JOB_ENVIRONMENT" not in fitted
    by_hand = render(spec, job_dir, "t" * 32, SlurmOptions(), carry_environment=True)
    line = next(x for x in by_hand.splitlines() if "MESHTRAIN_JOB_ENVIRONMENT" in x)
    exported = line.split("=", 1)[1].strip("'")
    assert json.loads(exported) == SPEC.environment


def _recorded_job(tmp_path: Path) -> JobDirectory:
    job_dir = JobDirectory(tmp_path / "j")
    job_dir.root.mkdir()
    job_dir.spec_file.write_text(SPEC.to_record_json())
    job_dir.token_file.write_text("t" * 32)
    return job_dir


def test_the_supervisor_gives_the_hosts_the_values_and_loopback_only(tmp_path, monkeypatch):
    job_dir = _recorded_job(tmp_path)
    monkeypatch.setenv(job_environment.MESHTRAIN_JOB_ENVIRONMENT,
                       job_environment.encode(SPEC.environment))
    supervisor = HostSupervisor(job_dir)
    assert supervisor.spec.environment == SPEC.environment
    env = local_host_environment(supervisor.spec, job_dir, "algo-1", 29500, "t" * 32)
    assert env["HF_TOKEN"] == "hf_secret_value"
    assert job_environment.MESHTRAIN_JOB_ENVIRONMENT not in env
    assert (env["MESHTRAIN_MASTER_ADDR"], env["GLOO_SOCKET_IFNAME"],
            env["NCCL_SOCKET_IFNAME"]) == ("127.0.0.1", "lo", "lo")


def test_a_slurm_node_without_the_values_fails_the_job_naming_them(tmp_path, monkeypatch):
    job_dir = _recorded_job(tmp_path)
    monkeypatch.delenv(job_environment.MESHTRAIN_JOB_ENVIRONMENT, raising=False)
    with pytest.raises(ConfigError) as missing:
        slurm_node.host_environment(job_dir, "algo-1", "127.0.0.1", 29500)
    assert slurm_node.record_host_failure(job_dir, "algo-1", f"ClientError: {missing.value}") == 1
    reason = hosts_reason(job_dir, 1, ["algo-1"])
    assert ("ClientError: the job's environment values of HF_TOKEN, N did not reach this "
            "process") in reason
    monkeypatch.setenv(job_environment.MESHTRAIN_JOB_ENVIRONMENT,  # sbatch's --export=ALL
                       job_environment.encode(SPEC.environment))
    env = slurm_node.host_environment(job_dir, "algo-1", "127.0.0.1", 29500)
    assert env["HF_TOKEN"] == "hf_secret_value"
    assert job_environment.MESHTRAIN_JOB_ENVIRONMENT not in env
