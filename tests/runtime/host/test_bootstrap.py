"""The host bootstrap: torchrun command, SM_* environment, failure reporting, code provisioning."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path

import pytest

from meshtrain.contract import JobSpec, OptMLPaths
from meshtrain.contract.failures import (
    OOM_INFO,
    RankFailure,
    format_reason,
    killed_by,
    pick_root_cause,
)
from meshtrain.contract.jobspec import write_host_config
from meshtrain_runtime.host import bootstrap, rank_entry
from meshtrain_runtime.host.contract import HostContract, build_sm_env
from meshtrain_runtime.host.provision import ProvisionError, provision_code

SMP = {"torch_distributed": {"enabled": True, "processes_per_host": 4},
       "smdistributed": {"modelparallel": {"enabled": True,
                                           "parameters": {"hybrid_shard_degree": 2}}}}


def host_tree(tmp_path, host="algo-2", count=3, distribution=SMP, submit="file:///none"):
    spec = JobSpec(job_name="job-1", entry_point="train.py", source_dir=str(tmp_path),
                   hyperparameters={"lr": 0.1, "name": "x"}, distribution=distribution,
                   instance_count=count, inputs={"train": "file:///data"})
    paths = OptMLPaths(tmp_path / host / "opt" / "ml")
    write_host_config(spec, paths.input_config_dir, host, submit)
    return HostContract.read(paths)


@pytest.fixture(autouse=True)
def no_overrides(monkeypatch):
    for name in ("MESHTRAIN_MASTER_ADDR", "MESHTRAIN_MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("MESHTRAIN_NUM_GPUS", "0")


def test_torchrun_command_uses_static_rendezvous_with_algo1_as_node0(tmp_path):
    contract = host_tree(tmp_path)
    command = bootstrap.build_command(contract, contract.paths.code_dir / "train.py")
    text = " ".join(command)
    assert "-m meshtrain_runtime.host.agent_entry --nproc-per-node 4 --nnodes 3" in text  # torchrun
    assert "--master-addr algo-1 --master-port 7777 --node-rank 1" in text
    assert "--rdzv-backend" not in text  # static: algo-1 is node 0, as on SageMaker
    user_args = "--lr 0.1 --mp_parameters hybrid_shard_degree=2 --name x"
    # no GPUs: the ranks are forks of the agent's fork server, which runs rank_entry's file
    assert text.endswith(f"--start-method forkserver --run-path --tee 3 --log-dir "
                         f"{contract.paths.output_dir}/meshtrain/torchrun "
                         f"{rank_entry.__file__} {contract.paths.code_dir}/train.py {user_args}")


@pytest.mark.parametrize("gpus, start", [(8, ""), (0, "exec")])
def test_ranks_are_processes_of_their_own_on_gpus_or_when_asked(tmp_path, monkeypatch, gpus,
                                                                 start):
    monkeypatch.setenv("MESHTRAIN_NUM_GPUS", str(gpus))
    monkeypatch.setenv("MESHTRAIN_RANK_START", start)
    contract = host_tree(tmp_path)
    text = " ".join(bootstrap.build_command(contract, contract.paths.code_dir / "train.py"))
    assert "--start-method" not in text and "--run-path" not in text
    assert text.endswith(f"-m meshtrain_runtime.host.rank_entry {contract.paths.code_dir}/train.py "
                         '--lr 0.1 --mp_parameters hybrid_shard_degree=2 --name x')
    environment = bootstrap.build_environment(contract, tmp_path, tmp_path / "train.py")
    assert "MESHTRAIN_RANK_PRELOAD" not in environment


def test_single_host_without_torchrun_runs_python_once(tmp_path):
    contract = host_tree(tmp_path, host="algo-1", count=1, distribution=None)
    command = bootstrap.build_command(contract, contract.paths.code_dir / "train.py")
    assert "torch.distributed.run" not in command
    assert command[1:4] == ["-m", "meshtrain_runtime.host.rank_entry", f"{contract.paths.code_dir}/"
                                                                  "train.py"]


def test_the_launch_phase_says_what_the_host_starts(tmp_path):
    assert bootstrap.launch_text(host_tree(tmp_path)) == (
        "algo-2 starts torchrun: 4 processes on each of 3 hosts")
    single = host_tree(tmp_path / "one", host="algo-1", count=1, distribution=None)
    assert bootstrap.launch_text(single) == "algo-1 runs train.py (one process)"


def test_sm_environment(tmp_path):
    contract = host_tree(tmp_path)
    env = build_sm_env(contract)
    assert env["SM_CURRENT_HOST"] == "algo-2"
    assert env["SM_CURRENT_HOST_RANK"] == "1"
    assert env["SM_HOSTS"] == '["algo-1","algo-2","algo-3"]'
    assert env["SM_HP_MP_PARAMETERS"] == '{"hybrid_shard_degree":2}'
    assert json.loads(env["SM_FRAMEWORK_PARAMS"])["sagemaker_torch_distributed_enabled"] is True
    assert env["SM_CHANNEL_TRAIN"] == str(contract.paths.channel_dir("train"))
    assert env["SM_MODULE_NAME"] == "train"
    assert json.loads(env["SM_USER_ARGS"])[:2] == ["--lr", "0.1"]
    assert json.loads(env["SM_TRAINING_ENV"])["hosts"] == ["algo-1", "algo-2", "algo-3"]
    assert contract.distribution().smp.hybrid_shard_degree == 2


def test_failure_message_puts_the_rank_error_first_and_flags_oom():
    error = RankFailure("algo-2", 3, 0.0, "exception", "ValueError: bad", "Traceback")
    text = bootstrap.failure_message(1, ["torchrun", "x.py"], error, "tail")
    assert text.startswith('ExecuteUserScriptError:\nExitCode 1\nErrorMessage "rank 3 on algo-2: '
                           "ValueError: bad")
    assert "OutOfMemory" not in text
    killed = bootstrap.failure_message(1, ["torchrun"], None, "  exitcode  : -9 (pid: 12)\n")
    assert 'ExtraInfo "OutOfMemory: Process killed by SIGKILL (signal 9)"' in killed
    assert "OutOfMemory" in bootstrap.failure_message(137, ["python"], None, "")


def test_failure_file_written_by_the_script_wins(tmp_path):
    paths = OptMLPaths(tmp_path)
    paths.output_dir.mkdir(parents=True)
    paths.failure_file.write_text("my own reason")
    bootstrap.write_failure(paths, "generic reason")
    assert paths.failure_file.read_text() == "my own reason"


def _tar_with(path, name):
    with tarfile.open(path, "w:gz") as tar:
        info = tarfile.TarInfo(name)
        info.size = 1
        tar.addfile(info, io.BytesIO(b"x"))


def test_provision_refuses_an_escaping_archive(tmp_path):
    _tar_with(tmp_path / "src.tar.gz", "../../evil.py")
    contract = host_tree(tmp_path, submit=f"file://{tmp_path}/src.tar.gz")
    with pytest.raises(ProvisionError, match="refusing"):
        provision_code(contract)
    assert not (tmp_path / "evil.py").exists()


def test_bootstrap_main_reports_a_missing_entry_point_as_user_error(tmp_path, monkeypatch):
    _tar_with(tmp_path / "src.tar.gz", "other.py")
    contract = host_tree(tmp_path, submit=f"file://{tmp_path}/src.tar.gz")
    monkeypatch.setenv("SAGEMAKER_BASE_DIR", str(contract.paths.base))
    with pytest.raises(SystemExit) as exit_info:
        bootstrap.main()
    assert exit_info.value.code == bootstrap.USER_ERROR
    assert "entry point 'train.py' is not in" in contract.paths.failure_file.read_text()


GLOO = ("RuntimeError: [../third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
        "by peer [127.0.0.1]:34199")


def test_collect_failures_merges_rank_tracebacks_with_the_agents_view(tmp_path):
    (tmp_path / "rank-2.json").write_text(json.dumps(
        {"rank": 2, "host": "algo-2", "message": GLOO, "traceback": "tb", "time": 12.5}))
    (tmp_path / "agent-failures.json").write_text(json.dumps([
        {"rank": 3, "exitcode": -9, "time": 12.0, "message": ""},
        {"rank": 2, "exitcode": 1, "time": 13.0, "message": ""}]))
    failures = bootstrap.collect_failures("algo-2", tmp_path, 1, "tail", None, None)
    by_rank = {f.rank: f for f in failures}
    assert by_rank[3].message == "killed by SIGKILL (signal 9)" and by_rank[3].signal == "SIGKILL"
    assert by_rank[2].kind == "exception" and by_rank[2].secondary  # its traceback, not "exit 1"
    stopped = bootstrap.collect_failures("algo-1", tmp_path / "none", 1, "", 15, None)
    assert stopped[0].message == "stopped by SIGTERM (signal 15)" and stopped[0].secondary


def test_a_rank_record_is_replaced_whole_or_not_at_all(tmp_path, monkeypatch):
    """A rank's agent may end it while it writes its record (a peer failed first): the record
    it had (its hang report) must not be cut in half by the one it was writing."""
    from meshtrain.contract import failures

    hang = {"rank": 0, "message": "Hang: no progress for 10 s, waiting in a collective for a peer",
            "time": 10.0}
    failures.write_rank_record(tmp_path, hang)

    def ended_while_writing(path, text):
        Path(path).write_bytes(text.encode()[:10])  # the write the rank did not finish
        raise KeyboardInterrupt
    monkeypatch.setattr(failures.Path, "write_text", ended_while_writing)
    with pytest.raises(KeyboardInterrupt):
        failures.write_rank_record(tmp_path, {**hang, "message": GLOO, "time": 30.0})
    monkeypatch.undo()
    (record,) = bootstrap.collect_failures("algo-1", tmp_path, 1, "", None, None)
    assert record.message == hang["message"] and record.secondary


def test_root_cause_is_the_earliest_primary_never_a_secondary_collective_error():
    peer = RankFailure("algo-1", 0, 11.9, "exception", GLOO, "tb")
    killed = killed_by("algo-2", 3, 9, 12.0)
    late = RankFailure("algo-1", 1, 14.0, "exception", "ValueError: late", "tb")
    root, others = pick_root_cause([late, peer, killed])
    assert root is killed and [f.rank for f in others] == [0, 1]
    assert pick_root_cause([late, peer])[0] is late
    assert pick_root_cause([peer])[0] is peer  # only secondaries: the earliest of them


def test_failure_reason_puts_who_and_how_before_the_cut():
    killed = RankFailure("algo-2", 3, 12.0, "signal", "killed by SIGKILL (signal 9)",
                         "x" * 5000, signal="SIGKILL")
    peer = RankFailure("algo-1", 0, 12.1, "exception", GLOO, "tb")
    reason = format_reason(killed, [peer], 1000)
    lines = reason.splitlines()
    assert len(reason) == 1000
    assert lines[0] == "rank 3 on algo-2: killed by SIGKILL (signal 9)"
    assert lines[1] == f'ExtraInfo "{OOM_INFO}"'
    assert lines[2].startswith("Failed as a consequence: rank 0 on algo-1 (RuntimeError: ")
    text = bootstrap.failure_message(1, ["python"], killed, "", [peer])
    assert text.index("SIGKILL") < text.index("OutOfMemory") < text.index("xxxx") < 300
