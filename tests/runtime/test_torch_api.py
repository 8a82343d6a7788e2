"""meshtrain_runtime.torch_api: one test per private or version-dependent torch API the runtime
uses, on the installed torch; each fails when that API's behaviour changes. CI's version tier
(.ci/versions.py) runs this file on every torch in TESTED_TORCH_VERSIONS.

The DeviceMesh and DTensor-layout cases play 8 ranks on torch's fake process group in one
subprocess (bookkeeping is real, no collective runs); the rest run in a world of one process
(gloo) in the test process.
"""

from __future__ import annotations

import importlib.util
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from meshtrain_runtime import torch_api

ROOT = Path(__file__).resolve().parents[2]

PLAYER = r"""
import json
import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor, Shard
from torch.testing._internal.distributed.fake_pg import FakeStore
from meshtrain_runtime.torch_api import flatten_mesh, local_shape_and_offset, unflatten_mesh

def ranks(group):
    return dist.get_process_group_ranks(group)

out = []
for rank in range(8):
    dist.init_process_group("fake", store=FakeStore(), rank=rank, world_size=8)
    world = init_device_mesh("cpu", (8,), mesh_dim_names=("world",))
    layout = unflatten_mesh(world, "world", (2, 2, 2), ("a", "b", "c"))
    split = unflatten_mesh(layout, "b", (2, 1), ("b1", "b2"))  # an inner axis, by name
    flat = flatten_mesh(layout["a", "c"], "ac")
    joined = flatten_mesh(layout["b", "c"])
    spread = DTensor.from_local(torch.zeros(1), layout["a", "c"], [Shard(0), Shard(0)],
                                run_check=False, shape=torch.Size([10]),
                                stride=(1,))
    out.append({
        "rank": rank,
        "layout": [list(layout.mesh_dim_names), layout.mesh.tolist()],
        "split": [list(split.mesh_dim_names), split.mesh.tolist()],
        "groups": {name: ranks(layout.get_group(name)) for name in ("a", "b", "c")},
        "split_groups": {name: ranks(split.get_group(name)) for name in ("b1", "c")},
        "flat": [list(flat.mesh_dim_names), flat.mesh.tolist(), ranks(flat.get_group())],
        "joined": [list(joined.mesh_dim_names), joined.mesh.tolist()],
        "local": local_shape_and_offset(spread),
    })
    dist.destroy_process_group()
print(json.dumps(out))
"""


@pytest.fixture(scope="module")
def played() -> dict[int, dict]:
    result = subprocess.run([sys.executable, "-c", PLAYER], capture_output=True, text=True,
                            timeout=300, check=False)
    assert result.returncode == 0, result.stderr[-4000:]
    return {row["rank"]: row for row in json.loads(result.stdout.strip().splitlines()[-1])}


@pytest.fixture
def world_of_one(single_process_runtime):
    """A world of one process (gloo) with the runtime's meshes; yields the world mesh."""
    yield single_process_runtime.init({}).meshes.world


# ----------------------------------------------------------------------------- versions
def _versions_tier():
    spec = importlib.util.spec_from_file_location("ci_versions", ROOT / ".ci" / "versions.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["ci_versions"] = module
    spec.loader.exec_module(module)
    return module


def test_tested_versions_are_the_ones_ci_installs():
    tier = _versions_tier()
    readme = (ROOT / "README.md").read_text()
    pinned = set(re.findall(r"torch==([0-9.]+)", readme))
    assert len(pinned) == 1, pinned  # README's commands pin one torch
    installed = {tier.torch_version(e) for e in tier.ENVIRONMENTS} | pinned
    assert set(torch_api.TESTED_TORCH_VERSIONS) == installed


def test_the_installed_torch_is_a_tested_release():
    assert torch_api.torch_release() in torch_api.TESTED_TORCH_VERSIONS, torch.__version__


def test_an_untested_torch_gets_one_line_and_a_tested_one_none():
    assert torch_api.torch_release("2.14.1+cu130") == "2.14.1"
    assert torch_api.untested_torch_message(torch_api.TESTED_TORCH_VERSIONS[0] + "+cpu") is None
    message = torch_api.untested_torch_message("2.99.0")
    assert message.count("\n") == 0 and message.endswith("docs/compatibility.md.")
    assert "torch 2.99.0" in message
    for version in torch_api.TESTED_TORCH_VERSIONS:
        assert version in message


def test_init_prints_the_line_once_on_rank_zero(single_process_runtime, monkeypatch, capfd):
    monkeypatch.setattr(torch, "__version__", "2.99.0+cpu")
    single_process_runtime.init({})
    single_process_runtime.init({})  # the same parameters: the current state, no second line
    captured = capfd.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert lines == [torch_api.untested_torch_message("2.99.0")], captured.err
    assert "Traceback" not in captured.out + captured.err
    torch_api.announce_untested_torch(rank=1)  # other ranks stay quiet
    assert capfd.readouterr().err == ""


# ----------------------------------------------------------------------------- DeviceMesh
def _coords(rank: int) -> tuple[int, int, int]:
    return rank // 4, rank // 2 % 2, rank % 2


def test_unflatten_mesh_splits_an_axis_into_row_major_axes(played):
    for rank, row in played.items():
        a, b, c = _coords(rank)
        assert row["layout"] == [["a", "b", "c"], [[[0, 1], [2, 3]], [[4, 5], [6, 7]]]]
        assert row["groups"]["a"] == [b * 2 + c, 4 + b * 2 + c]
        assert row["groups"]["b"] == [a * 4 + c, a * 4 + 2 + c]
        assert row["groups"]["c"] == [a * 4 + b * 2, a * 4 + b * 2 + 1]


def test_unflatten_mesh_takes_an_inner_axis_by_name(played):
    """torch 2.11 refused every axis given by name to DeviceMesh._unflatten."""
    for row in played.values():
        assert row["split"][0] == ["a", "b1", "b2", "c"]
        assert row["split"][1] == [[[[0, 1]], [[2, 3]]], [[[4, 5]], [[6, 7]]]]
        assert row["split_groups"]["b1"] == row["groups"]["b"]
        assert row["split_groups"]["c"] == row["groups"]["c"]


def test_flatten_mesh_joins_axes_under_one_name(played):
    for rank, row in played.items():
        a, b, _ = _coords(rank)
        members = [a2 * 4 + b * 2 + c2 for a2 in range(2) for c2 in range(2)]
        assert row["flat"] == [["ac"], members, members]
        assert row["joined"] == [["b_c"], [a * 4 + i for i in range(4)]]  # the default name


def test_local_shape_and_offset_of_an_uneven_shard(played):
    """10 rows over a 2 x 2 mesh, Shard(0) twice: 5 + 5 over the first axis, each 3 + 2 over
    the second."""
    for rank, row in played.items():
        a, _, c = _coords(rank)
        index = a * 2 + c
        assert row["local"] == [[[3, 2, 3, 2][index]], [[0, 3, 5, 8][index]]]


# ----------------------------------------------------------------------------- collectives
def test_all_to_all_and_wait(world_of_one):
    sent = torch.arange(6.0)
    pending = torch_api.all_to_all_single(sent, None, None, world_of_one)
    assert isinstance(pending, torch.Tensor)
    assert torch.equal(torch_api.wait_collective(pending), sent)
    counts = torch_api.all_to_all_single(sent, [6], [6], world_of_one)
    assert torch.equal(torch_api.wait_collective(counts), sent)


def test_all_to_all_autograd_sends_the_gradient_back(world_of_one):
    sent = torch.arange(4.0, requires_grad=True)
    received = torch_api.all_to_all_single_autograd(sent, [4], [4], world_of_one)
    weights = torch.tensor([1.0, 2.0, 3.0, 4.0])
    (torch_api.wait_collective(received) * weights).sum().backward()
    assert torch.equal(sent.grad, weights)


def test_all_gather_autograd_gathers_on_dim_0_without_a_warning(world_of_one):
    stats = torch.tensor([[1.0, 2.0]], requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # torch 2.13 deprecated the 2.10-2.12 name
        gathered = torch_api.wait_collective(torch_api.all_gather_autograd(stats, world_of_one))
    assert gathered.shape == (1, 2)
    (gathered * 3).sum().backward()
    assert torch.equal(stats.grad, torch.full((1, 2), 3.0))


def test_a_pending_result_is_an_async_collective_tensor(world_of_one):
    from torch.distributed import _functional_collectives as funcol

    pending = funcol.all_reduce(torch.ones(3), "sum", world_of_one)
    assert isinstance(pending, torch_api.AsyncCollectiveTensor)
    value = torch_api.collective_value(pending)
    assert type(value) is torch.Tensor
    assert torch.equal(torch_api.wait_collective(pending), torch.ones(3))


# ----------------------------------------------------------------------------- autograd engine
def test_backward_callback_runs_after_the_backward():
    events: list[str] = []
    weight = torch.ones(2, requires_grad=True)

    def hook(grad: torch.Tensor) -> torch.Tensor:
        events.append(f"hook in backward: {torch_api.backward_is_running()}")
        torch_api.queue_backward_callback(lambda: events.append("callback"))
        return grad

    weight.register_hook(hook)
    assert not torch_api.backward_is_running()
    (weight * 2).sum().backward()
    assert events == ["hook in backward: True", "callback"]
    assert torch.equal(weight.grad, torch.full((2,), 2.0))


def test_tree_map_and_tree_flatten_walk_nested_containers():
    nested = {"a": [torch.ones(1), (2, torch.zeros(1))], "b": None}
    leaves, _spec = torch_api.tree_flatten(nested)
    assert [type(x).__name__ for x in leaves] == ["Tensor", "int", "Tensor", "NoneType"]
    doubled = torch_api.tree_map(lambda x: x * 2 if isinstance(x, torch.Tensor) else x, nested)
    assert doubled["a"][0].item() == 2 and doubled["a"][1][0] == 2 and doubled["b"] is None


# ----------------------------------------------------------------------------- tensors
def test_dtensor_local_is_the_stored_shard(world_of_one):
    from torch.distributed.tensor import Replicate, distribute_tensor

    full = torch.arange(4.0)
    dtensor = distribute_tensor(full, world_of_one, [Replicate()])
    local = torch_api.dtensor_local(dtensor)
    assert type(local) is torch.Tensor and torch.equal(local, full)
    assert local.untyped_storage().data_ptr() == dtensor.to_local().untyped_storage().data_ptr()
    assert torch_api.dtensor_local(full) is full


def test_view_base_is_the_viewed_tensor():
    base = torch.zeros(4)
    assert torch_api.view_base(base[1:]) is base
    assert torch_api.view_base(base) is base


def test_wrap_compiled_call_routes_calls_of_a_compiled_module():
    module = nn.Linear(2, 2)
    module.compile(backend="eager")
    calls: list[int] = []

    def wrap(compiled):
        def call(*args, **kwargs):
            calls.append(1)
            return compiled(*args, **kwargs)
        return call

    torch_api.wrap_compiled_call(module, wrap)
    x = torch.ones(1, 2)
    assert torch.allclose(module(x), F.linear(x, module.weight, module.bias))
    assert calls == [1]


def test_flash_attention_cpu_matches_sdpa_and_its_gradients():
    torch.manual_seed(0)
    q, k, v = (torch.randn(1, 2, 5, 4, requires_grad=True) for _ in range(3))
    out, lse = torch_api.flash_attention_cpu(q, k, v, 0.0, True, scale=0.5)
    expected = F.scaled_dot_product_attention(q, k, v, is_causal=True, scale=0.5)
    assert torch.allclose(out, expected, atol=1e-6)
    scores = (q @ k.transpose(-1, -2) * 0.5).masked_fill(
        torch.ones(5, 5, dtype=torch.bool).triu(1), float("-inf"))
    assert torch.allclose(lse, torch.logsumexp(scores, dim=-1), atol=1e-6)
    grad_out = torch.randn_like(out)
    grads = torch_api.flash_attention_cpu_backward(
        grad_out, q, k, v, out, lse, 0.0, True, scale=0.5)
    expected_grads = torch.autograd.grad(expected, (q, k, v), grad_out)
    for got, want in zip(grads, expected_grads, strict=True):
        assert torch.allclose(got, want, atol=1e-5)


# ----------------------------------------------------------------------------- FSDP2
def test_fsdp2_unsharded_parameters_hold_storage_only_while_gathered(world_of_one):
    from torch.distributed.fsdp import fully_shard

    model = fully_shard(nn.Linear(4, 4), mesh=world_of_one, reshard_after_forward=False)

    def held() -> int:
        return sum(tensor.untyped_storage().nbytes()
                   for tensor in torch_api.fsdp2_unsharded_parameters(model))

    model.unshard()
    assert held() == (16 + 4) * 4  # weight and bias, float32
    model.reshard()
    assert held() == 0


# ----------------------------------------------------------------------------- FSDP1
def test_fsdp1_handle_and_flat_param_layout(world_of_one):
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(nn.Sequential(nn.Linear(3, 4), nn.Linear(4, 2)), use_orig_params=True,
                 device_mesh=world_of_one, device_id=torch.device("cpu"))
    handle = torch_api.fsdp1_handle(model)
    assert handle is not None and torch_api.fsdp1_uses_orig_params(handle)
    layout = torch_api.flat_param_layout(handle.flat_param)
    originals = list(model.parameters())
    assert [id(p) for p in layout.params] == [id(p) for p in originals]
    assert [tuple(s) for s in layout.shapes] == [(4, 3), (4,), (2, 4), (2,)]
    assert list(layout.numels) == [12, 4, 8, 2]
    real = [n for n, pad in zip(layout.numels_with_padding, layout.is_padding_mask,
                                strict=True) if not pad]
    assert real == [12, 4, 8, 2]
    offsets = [info.offset_in_shard for info in layout.shard_param_infos]
    assert offsets == [0, 12, 16, 24]  # one rank: every parameter whole, in order
    assert all(info.in_shard and info.numel_in_shard == n
               for info, n in zip(layout.shard_param_infos, real, strict=True))
    assert list(layout.param_extensions) == [None] * 4  # plain tensors, no DTensor spec
    assert torch_api.fsdp1_syncs_gradients(model)
    with model.no_sync():
        assert not torch_api.fsdp1_syncs_gradients(model)


def test_wrap_policy_classes_and_the_custom_policy_base():
    from torch.distributed.fsdp.wrap import CustomPolicy, ModuleWrapPolicy

    policy = ModuleWrapPolicy({nn.Linear})
    assert torch_api.wrap_policy_module_classes(policy) == {nn.Linear}
    assert isinstance(policy, torch_api.CustomWrapPolicy)
    assert isinstance(CustomPolicy(lambda module: False), torch_api.CustomWrapPolicy)
    assert not isinstance(lambda **kwargs: False, torch_api.CustomWrapPolicy)


def test_clean_tensor_name_drops_fsdp_and_checkpoint_prefixes():
    name = "_fsdp_wrapped_module.blocks.0._checkpoint_wrapped_module.attn.weight"
    assert torch_api.clean_tensor_name(name) == "blocks.0.attn.weight"


# ----------------------------------------------------------------------------- checkpoints
def test_unflatten_state_dict_inverts_dcps_flattening():
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict

    nested = {"model": {"layer": {"weight": torch.ones(2)}}, "step": 3}
    flat, mapping = flatten_state_dict(nested)
    assert set(flat) == {"model.layer.weight", "step"}
    back = torch_api.unflatten_state_dict(flat, mapping)
    assert back["step"] == 3 and torch.equal(back["model"]["layer"]["weight"], torch.ones(2))


def test_save_and_load_state_dict_impl_take_a_group_and_coordinator(world_of_one, tmp_path):
    import torch.distributed.checkpoint as dcp

    group = dist.group.WORLD
    torch_api.save_state_dict_impl({"w": torch.arange(3.0)},
                                   storage_writer=dcp.FileSystemWriter(str(tmp_path)),
                                   process_group=group, coordinator_rank=0, planner=None)
    target = {"w": torch.zeros(3)}
    torch_api.load_state_dict_impl(target, storage_reader=dcp.FileSystemReader(str(tmp_path)),
                                   process_group=group, coordinator_rank=0, planner=None)
    assert torch.equal(target["w"], torch.arange(3.0))
