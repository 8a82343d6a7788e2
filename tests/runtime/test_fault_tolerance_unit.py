"""Issue 36, the runtime's refusals and pieces that need no second process.

The real run (lighthouse, 2 replica groups, a kill and a heal) is test_fault_tolerance.py.
"""

from __future__ import annotations

import json
import platform
import sys
from datetime import timedelta

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
