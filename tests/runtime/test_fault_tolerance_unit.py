"""Issue 36, the runtime's refusals and pieces that need no second process.

The real run (lighthouse, 2 replica groups, a kill and a heal) is test_fault_tolerance.py.
"""

from __future__ import annotations

import json
import pickle
import platform
import sys
from datetime import timedelta
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch

from meshtrain.contract import env as names
from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.errors import ConfigError
from meshtrain_runtime import fault
from meshtrain_runtime.fault.records import RecordWriter, StepRecord, records_path
from meshtrain_runtime.fault.shards import (
    load_model_shards,
    load_optimizer_shards,
    model_shards,
    optimizer_shards,
)
from meshtrain_runtime.fault.torchft_parts import import_torchft

FT_ENV = {names.MESHTRAIN_FT_REPLICA_GROUP: "0", names.MESHTRAIN_FT_REPLICA_GROUPS: "2",
          names.MESHTRAIN_FT_LIGHTHOUSE: "http://127.0.0.1:1"}


def degrees(world: int, replicate: int, shard: int, tp: int = 1) -> ResolvedDegrees:
    return ResolvedDegrees(world_size=world, replicate_degree=replicate, hybrid_shard_degree=shard,
                           tensor_parallel_degree=tp, context_parallel_degree=1,
                           expert_parallel_degree=1, sharding_strategy="hybrid_shard")


def test_without_the_environment_the_state_is_left_alone(monkeypatch):
    for key in FT_ENV:
        monkeypatch.delenv(key, raising=False)
    assert fault.start(rank=0, world_size=2, degrees=degrees(2, 1, 2), device_type="cpu") is None
    assert fault.session() is None and fault.current_step() is None


@pytest.mark.parametrize(("layout", "message"), [
    (degrees(4, 2, 2), "resolve to replicate 2 x shard 2"),
    (degrees(4, 1, 2, tp=2), "tp 2"),
])
def test_a_group_world_that_is_not_one_sharding_group_is_refused(monkeypatch, layout, message):
    monkeypatch.setattr("os.environ", {**FT_ENV})
    with pytest.raises(ConfigError) as error:
        fault.start(rank=0, world_size=layout.world_size, degrees=layout, device_type="cpu")
    assert message in str(error.value)
    assert f"Set hybrid_shard_degree={layout.world_size}" in str(error.value)


def test_a_missing_torchft_is_a_clear_runtime_error(monkeypatch):
    monkeypatch.setitem(sys.modules, "torchft", None)  # import torchft raises ImportError
    with pytest.raises(RuntimeError) as error:
        import_torchft()
    assert "pip install 'meshtrain[ft]'" in str(error.value)
    assert "Linux x86_64 only" in str(error.value)


@pytest.mark.skipif((platform.system(), platform.machine()) != ("Linux", "x86_64"),
                    reason="torchft (meshtrain[ft]) is published for Linux x86_64 only")
def test_a_restarted_group_forgets_the_dead_managers_address(single_process_runtime,
                                                            monkeypatch):
    """torchrun restarting a group's workers in place keeps its store: the address the dead
    Manager published there must be gone before the new ranks look for their Manager."""
    import torch.distributed as dist
    from torchft.manager import MANAGER_ADDR_KEY, REPLICA_ID_KEY

    from meshtrain_runtime.fault.torchft_parts import _forget_earlier_manager

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False)
    for key in (MANAGER_ADDR_KEY, REPLICA_ID_KEY):
        store.set(key, "http://dead:1")
    monkeypatch.setenv("MASTER_ADDR", "127.0.0.1")
    monkeypatch.setenv("MASTER_PORT", str(store.port))
    single_process_runtime.init()
    _forget_earlier_manager(0, timedelta(seconds=10))
    assert not store.check([MANAGER_ADDR_KEY]) and not store.check([REPLICA_ID_KEY])


def test_the_json_lines_go_to_the_output_data_dir(tmp_path):
    assert records_path(1, {"SM_OUTPUT_DATA_DIR": str(tmp_path)}) == (
        tmp_path / "fault_tolerance" / "replica-1.jsonl")
    assert str(records_path(0, {})) == "/opt/ml/output/data/fault_tolerance/replica-0.jsonl"
    writer = RecordWriter(records_path(1, {"SM_OUTPUT_DATA_DIR": str(tmp_path)}))
    record = StepRecord(step=3, replica_group=1, participants=[0, 1], committed=True, began=1.25,
                        quorum_seconds=0.125, time=1.5, healed=False, loss=0.25,
                        effective_batch=16)
    writer.write(record)
    writer.write(record)
    lines = writer.path.read_text().splitlines()
    assert [json.loads(line) for line in lines] == [{
        "step": 3, "replica_group": 1, "participants": [0, 1], "committed": True, "began": 1.25,
        "quorum_seconds": 0.125, "time": 1.5, "healed": False, "loss": 0.25,
        "effective_batch": 16}] * 2


def test_shards_move_model_and_adamw_state_between_models_bitwise():
    torch.manual_seed(0)
    source, target = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    optimizer = torch.optim.AdamW(source.parameters(), lr=0.1)
    source(torch.randn(2, 4)).sum().backward()
    optimizer.step()
    fresh = torch.optim.AdamW(target.parameters(), lr=0.1)
    assert optimizer_shards(None) is None
    load_model_shards(target, model_shards(source))
    load_optimizer_shards(fresh, optimizer_shards(optimizer))
    for a, b in zip(source.parameters(), target.parameters(), strict=True):
        assert torch.equal(a, b)
    for key, entry in optimizer.state_dict()["state"].items():
        for name, value in entry.items():
            assert torch.equal(value, fresh.state_dict()["state"][key][name]), name
    with pytest.raises(RuntimeError, match="lacks"):
        load_model_shards(target, {})


# --- the session's parts that need no Manager (it starts at the group's first step) ----------

def _session(tmp_path, group: int = 1, rank: int = 0):
    from meshtrain.contract.fault_tolerance import ReplicaGroupEnv
    from meshtrain_runtime.fault.group_session import FaultSession

    settings = ReplicaGroupEnv(group, 2, "http://127.0.0.1:1",
                               coordination_dir=str(tmp_path / "coordination"))
    return FaultSession(settings, group_rank=rank, group_world_size=2, device_type="cpu")


def test_a_group_joins_no_quorum_before_its_first_step(tmp_path, monkeypatch):
    """init() and transform() make no Manager: nothing heartbeats the lighthouse yet."""
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    session = _session(tmp_path)
    assert session.manager is None and session.current_step() == 0
    session.resume({"step": 20, "batches_committed": 40})  # a loaded checkpoint's count
    assert session.current_step() == 20
    assert session.checkpoint_record() == {"step": 20, "batches_committed": 40}


def test_a_step_is_checkpointed_by_the_lowest_group_of_its_quorum(tmp_path, monkeypatch):
    from meshtrain_runtime.fault.coordination import checkpoint_writer

    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    assert checkpoint_writer([0, 1]) == 0 and checkpoint_writer([1, 2]) == 1
    assert checkpoint_writer([]) == 0  # before any quorum: group 0
    session = _session(tmp_path, group=1)
    session.process_group = SimpleNamespace(participants=[0, 1])
    assert not session.writes_checkpoint()
    session.process_group.participants = [1]  # group 0 is down: group 1 writes
    assert session.writes_checkpoint()


def test_a_tracked_scheduler_moves_only_with_committed_steps_and_heals(tmp_path, monkeypatch):
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    from meshtrain_runtime.fault.follow import follow

    session = _session(tmp_path)
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    scheduler = follow(session, torch.optim.lr_scheduler.LambdaLR(
        optimizer, lambda k: 1.0 / (k + 1)))
    optimizer.step()
    scheduler.step()
    session.committed = False  # the optimizer step did not commit
    scheduler.step()
    assert scheduler.last_epoch == 1 and optimizer.param_groups[0]["lr"] == 0.5
    load, save = session.state_fns["lr_scheduler.0"]  # what a healing peer receives
    peer = save()
    pickle.dumps(peer)  # it travels (and checkpoints hold it): nothing of the wrapping in it
    plain = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    assert set(peer) == set(torch.optim.lr_scheduler.LambdaLR(plain, lambda k: 1.0).state_dict())
    session.committed = True
    for _ in range(3):
        scheduler.step()
    load(peer)
    assert scheduler.last_epoch == 1
    assert follow(session, scheduler) is scheduler  # once is enough
    with pytest.raises(ConfigError, match="follows a torch LR scheduler"):
        follow(session, object())


def test_a_tracked_scaler_keeps_its_scale_through_a_step_that_did_not_commit(tmp_path,
                                                                              monkeypatch):
    from meshtrain_runtime.fault.follow import follow

    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    session = _session(tmp_path)
    scaler = follow(session, torch.amp.GradScaler("cpu", init_scale=8.0, growth_interval=1))
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    for committed in (True, False, True):
        scaler.scale(model(torch.ones(1, 2)).sum()).backward()
        scaler.step(optimizer)
        session.committed = committed
        scaler.update()
        optimizer.zero_grad()
    assert scaler.get_scale() == 32.0  # grew twice (growth_interval 1), not three times
    assert "grad_scaler.0" in session.state_fns


def test_track_without_fault_tolerance_leaves_the_scheduler_alone():
    optimizer = torch.optim.SGD(torch.nn.Linear(2, 1).parameters(), lr=1.0)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda k: 1.0)
    step = scheduler.step
    assert fault.track(scheduler) is scheduler and scheduler.step == step


def test_a_finished_group_marks_it_and_the_others_find_it(tmp_path, monkeypatch):
    from meshtrain_runtime.fault import coordination

    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    session = _session(tmp_path, group=0)
    session.finish()  # no step was ever taken: nothing to say
    assert coordination.finished_groups(session.settings.coordination_dir, 1) == {}
    session.manager = SimpleNamespace(current_step=lambda: 240)
    session.finish()
    found = coordination.finished_groups(session.settings.coordination_dir, 1)
    assert found[0]["committed_steps"] == 240 and found[0]["time"] > 0
    assert coordination.finished_groups(session.settings.coordination_dir, 0) == {}
    line = coordination.mark_superseded(session.settings.coordination_dir, 1, found, 200)
    assert line.startswith("meshtrain: replica group 1 stops: replica group 0 finished the job "
                           "(240 steps committed)")
    stop = coordination.ReplicaGroupSuperseded(line)
    assert isinstance(stop, SystemExit) and stop.code == 0


def test_the_rank_entry_marks_a_finished_group_only_on_success(monkeypatch):
    from meshtrain_runtime.host import rank_entry

    calls = []
    monkeypatch.setitem(sys.modules, "meshtrain_runtime.fault",
                        SimpleNamespace(finish=lambda: calls.append("finish")))
    rank_entry.finish_replica_group()
    assert calls == ["finish"]


def test_the_session_function_is_not_shadowed_by_a_submodule():
    """A submodule named like a function of the package replaces it once imported
    (fault.session() became a module and save_checkpoint's call to it failed)."""
    import meshtrain_runtime.fault.group_session  # noqa: F401

    assert callable(fault.session) and fault.session() is None
    names = {p.stem for p in Path(fault.__file__).parent.glob("*.py")}
    assert not names & set(fault.__all__), names & set(fault.__all__)


def test_optimizer_steps_of_checkpoint_helpers_are_no_training_steps(tmp_path, monkeypatch):
    """torch's state_dict helpers step an optimizer with zero gradients to create its state;
    inside fault.outside_training() that starts no quorum (no Manager) and commits nothing."""
    monkeypatch.setenv("SM_OUTPUT_DATA_DIR", str(tmp_path))
    session = _session(tmp_path)
    model = torch.nn.Linear(2, 1)
    optimizer = torch.optim.AdamW(model.parameters(), lr=0.1)
    session.param_ids = {id(p) for p in model.parameters()}
    monkeypatch.setattr(fault, "_session", session)
    with fault.outside_training():
        session._before_optimizer_step(optimizer, (), {})
    assert session.manager is None and session.optimizer is None
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(ConfigError, match="MASTER_ADDR is not set"):  # outside it, a step
        session._before_optimizer_step(optimizer, (), {})  # starts the group's Manager
