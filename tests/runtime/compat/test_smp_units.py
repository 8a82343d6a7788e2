"""SMP v2 compat pieces that need no process group: the alias, MoEConfig, strategy rules."""

from __future__ import annotations

import inspect
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from torch.distributed.fsdp import ShardingStrategy

from meshtrain import ConfigError
from meshtrain.contract.distribution import DistributionConfig
from meshtrain_runtime.compat import alias_wanted
from meshtrain_runtime.compat.smp._fsdp import resolve_strategy
from meshtrain_runtime.compat.smp.checkpoint.utils import SORT_BY_LAST_INT, limit_num_subdirs
from meshtrain_runtime.compat.smp.moe.moe_config import MoEConfig

PROBE = Path(__file__).parent / "alias_probe.py"


def run_probe(mp_parameters: dict | None) -> str:
    env = {k: v for k, v in os.environ.items() if k != "SM_HP_MP_PARAMETERS"}
    if mp_parameters is not None:
        env["SM_HP_MP_PARAMETERS"] = json.dumps(mp_parameters)
    done = subprocess.run([sys.executable, "-m", "meshtrain_runtime.host.rank_entry", str(PROBE)],
                          env={**env, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_rank_entry_installs_the_alias_for_smp_jobs_only():
    smp = "meshtrain_runtime.compat.smp"
    present = f"ALIAS=present {smp} {smp}.delayed_param"
    assert present in run_probe({"hybrid_shard_degree": 1})
    assert "ALIAS=absent (ModuleNotFoundError)" in run_probe(None)
    assert "ALIAS=absent" in run_probe({"hybrid_shard_degree": 1, "torch_sagemaker_alias": False})


def test_alias_wanted_follows_the_toolkit_rule():
    assert alias_wanted({"SM_HP_MP_PARAMETERS": '{"tensor_parallel_degree": 2}'})
    assert not alias_wanted({"SM_HP_MP_PARAMETERS": "{}"})
    assert not alias_wanted({})
    assert not alias_wanted({"SM_HP_MP_PARAMETERS": '{"torch_sagemaker_alias": false}'})


def test_alias_key_is_a_validated_distribution_parameter():
    dist = {"torch_distributed": {"enabled": True}, "smdistributed": {"modelparallel": {
        "enabled": True, "parameters": {"torch_sagemaker_alias": False}}}}
    assert DistributionConfig.from_dict(dist).smp.torch_sagemaker_alias is False
    dist["smdistributed"]["modelparallel"]["parameters"] = {"torch_sagemaker_alias": "no"}
    with pytest.raises(ConfigError, match="torch_sagemaker_alias"):
        DistributionConfig.from_dict(dist)


def test_install_makes_submodules_importable_and_uninstall_removes_them():
    from meshtrain_runtime.compat import (
        install_torch_sagemaker,
        is_installed,
        uninstall_torch_sagemaker,
    )

    install_torch_sagemaker()
    try:
        import torch.sagemaker.distributed.checkpoint.state_dict_saver as saver

        assert saver.async_save.__module__ == "meshtrain_runtime.compat.smp.distributed." \
            "checkpoint.state_dict_saver"
        assert is_installed()
    finally:
        uninstall_torch_sagemaker()
    assert not is_installed() and "torch.sagemaker" not in sys.modules
    with pytest.raises(ModuleNotFoundError):
        import torch.sagemaker  # noqa: F401


def test_alias_gives_torch_checkpoint_functions_smp_conventions_and_takes_them_back():
    """SMP's images ship a patched torch: AWS's scripts import these names from torch."""
    import torch.distributed.checkpoint as dcp
    import torch.distributed.checkpoint.optimizer as dcp_optimizer

    from meshtrain_runtime.compat import install_torch_sagemaker, uninstall_torch_sagemaker

    originals = (dcp.save_state_dict, dcp.load_state_dict,
                 dcp_optimizer.load_sharded_optimizer_state_dict)
    install_torch_sagemaker()
    try:
        from torch.distributed.checkpoint.optimizer import load_sharded_optimizer_state_dict

        assert "process_group" in inspect.signature(load_sharded_optimizer_state_dict).parameters
        assert dcp.save_state_dict is not originals[0]
        assert dcp.load_state_dict is not originals[1]
    finally:
        uninstall_torch_sagemaker()
    assert (dcp.save_state_dict, dcp.load_state_dict,
            dcp_optimizer.load_sharded_optimizer_state_dict) == originals


def test_smp_coordinator_is_a_global_rank_mapped_into_the_group(monkeypatch):
    import torch.distributed as dist

    from meshtrain_runtime.compat.smp._torch_dcp import smp_coordinator

    assert smp_coordinator(None, 3) == 3  # no group: torch's meaning
    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(dist, "get_process_group_ranks", lambda group: [2, 3])
    assert smp_coordinator(object(), 2) == 0  # AWS's min(get_global_ranks(group))
    assert smp_coordinator(object(), 3) == 1
    assert smp_coordinator(object(), 1) == 1  # not a member: an index in the group, as in torch


def test_moe_config_default_is_smps_sinkhorn_and_accepted():
    assert MoEConfig().moe_load_balancing == "sinkhorn"  # SMP's default, honoured since #32


@pytest.mark.parametrize(("field", "value", "match"), [
    ("smp_moe", False, "smp_moe=False"),
    ("global_token_shuffle", True, "global_token_shuffle=True"),
    ("moe_all_to_all_dispatcher", False, "moe_all_to_all_dispatcher=False"),
    ("moe_load_balancing", "balanced", "'balanced'"),
])
def test_moe_config_refusals_name_the_field(field, value, match):
    with pytest.raises(ConfigError, match=match):
        MoEConfig(**{"moe_load_balancing": "aux_loss", field: value})


def test_moe_config_honours_every_other_field():
    config = MoEConfig(smp_moe=True, random_seed=3, moe_load_balancing="aux_loss",
                       global_token_shuffle=False, moe_all_to_all_dispatcher=True,
                       moe_aux_loss_coeff=0.01, moe_z_loss_coeff=0.002,
                       use_cpu_initialization=True)
    assert (config.random_seed, config.moe_aux_loss_coeff, config.moe_z_loss_coeff) == \
        (3, 0.01, 0.002)
    assert config.load_balancing_coeff == 0.01
    assert MoEConfig(moe_load_balancing="none").load_balancing_coeff == 0.0


S = ShardingStrategy


@pytest.mark.parametrize(("requested", "shard", "replicas", "expected"), [
    (None, 1, 4, S.NO_SHARD),                       # H1
    (S.FULL_SHARD, 1, 2, S.NO_SHARD),
    (None, 4, 1, S.FULL_SHARD),                     # H0: one replica = full sharding
    (S.HYBRID_SHARD, 4, 1, S.FULL_SHARD),
    (S.SHARD_GRAD_OP, 4, 1, S.SHARD_GRAD_OP),
    (None, 2, 2, S.HYBRID_SHARD),                   # H2: overridden to hybrid
    (S.FULL_SHARD, 2, 2, S.HYBRID_SHARD),
    (S._HYBRID_SHARD_ZERO2, 2, 2, S._HYBRID_SHARD_ZERO2),  # H2: ZeRO-2 hybrid kept
])
def test_strategy_rules(requested, shard, replicas, expected):
    assert resolve_strategy(requested, shard, replicas) is expected


def test_limit_num_subdirs_keeps_the_newest(tmp_path):
    for step in (2, 10, 4):
        (tmp_path / f"llama-{step}steps").mkdir()
    (tmp_path / "other").mkdir()
    removed = limit_num_subdirs(str(tmp_path / "llama-10steps"), 2, sort_fn=SORT_BY_LAST_INT,
                                regex=r"^.*\d+steps$", log=False)
    assert [Path(p).name for p in removed] == ["llama-2steps"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["llama-10steps", "llama-4steps", "other"]


def test_patched_torch_signatures_are_the_checked_ones():
    """SMP's FSDP patches call torch's originals positionally: a torch whose patched symbols
    take other parameters fails here (update CHECKED_SIGNATURES after reading the new code)."""
    import torch
    from torch.distributed.fsdp import fully_shard

    from meshtrain_runtime.compat.smp import _torch_patches

    assert not _torch_patches.is_installed()
    assert _torch_patches.live_signatures() == _torch_patches.CHECKED_SIGNATURES
    assert inspect.unwrap(fully_shard).__kwdefaults__["mesh"] is None  # torch's own default
    assert torch.__version__.split("+")[0] in _torch_patches.CHECKED_TORCH_VERSIONS


def test_smp_fsdp_defaults_are_views_of_the_world_mesh_and_go_away(single_process_runtime):
    """In a world of one: the script's FSDP1 and fully_shard calls without a group get SMP's
    meshes, whose process groups are the runtime's world-mesh groups; tsm.reset() gives torch
    its constructor and fully_shard's default back."""
    from torch import nn
    from torch.distributed.fsdp import FullyShardedDataParallel, fully_shard

    from meshtrain_runtime.compat import smp as tsm
    from meshtrain_runtime.compat.smp._fsdp import compat_meshes

    original_init = FullyShardedDataParallel.__init__
    tsm.init({})
    try:
        meshes, runtime = compat_meshes(), single_process_runtime.current().meshes
        world_groups = {runtime.dense.get_group(axis).group_name for axis in range(3)}
        assert {g.group_name for g in meshes.fsdp1.get_all_groups()} <= world_groups
        wrapped = FullyShardedDataParallel(nn.Linear(4, 4))
        assert wrapped._device_mesh is meshes.fsdp1
        sharded = fully_shard(nn.Linear(4, 4))
        assert fully_shard.state(sharded)._fsdp_param_group.mesh_info.mesh is meshes.fsdp2
        assert tsm.state.cp_process_group is single_process_runtime.current().cp_process_group
    finally:
        tsm.reset()
    assert FullyShardedDataParallel.__init__ is original_init
    assert inspect.unwrap(fully_shard).__kwdefaults__["mesh"] is None


def test_fsdp1_with_tp_and_ep_is_refused_with_the_fix(monkeypatch):
    """FSDP1 under SMP runs EP over the expert data-parallel group, but not TP x EP."""
    from types import SimpleNamespace

    from meshtrain_runtime.compat.smp import _fsdp

    monkeypatch.setattr(_fsdp, "_meshes", _fsdp.CompatMeshes(fsdp1=None, fsdp2=None, tp=None))
    st = SimpleNamespace(expert_parallel_degree=2, tp_size=2, replicate_degree=1,
                         hybrid_shard_degree=2, world_size=4)
    with pytest.raises(ConfigError, match=r"expert_parallel_degree=2 and "
                       r"tensor_parallel_degree=2 is not supported.*FSDP2"):
        _fsdp.smp_fsdp1_kwargs(st, {})
    assert _fsdp.fsdp1_degrees(SimpleNamespace(
        expert_parallel_degree=2, hybrid_shard_degree=4, replicate_degree=1)) == (2, 1)


def test_fsdp1_ep_gives_experts_their_own_units_or_refuses():
    """Expert gradients are reduced unlike dense ones, so each MoE layer's experts are a unit."""
    import functools

    import torch
    from torch.distributed.fsdp.wrap import (
        CustomPolicy,
        ModuleWrapPolicy,
        size_based_auto_wrap_policy,
    )

    from meshtrain_runtime.compat.smp._fsdp1_ep import with_expert_units
    from meshtrain_runtime.parallel.expert import ExpertParallelExperts

    experts = object.__new__(ExpertParallelExperts)
    dense = torch.nn.Linear(2, 2)
    small = functools.partial(size_based_auto_wrap_policy, min_num_params=10**9)
    combined = with_expert_units(small)
    assert combined(module=experts, recurse=False, nonwrapped_numel=1)
    assert not combined(module=dense, recurse=False, nonwrapped_numel=1)
    assert ExpertParallelExperts in with_expert_units(None)._module_classes
    assert {ExpertParallelExperts, torch.nn.Linear} == set(
        with_expert_units(ModuleWrapPolicy({torch.nn.Linear}))._module_classes)
    with pytest.raises(ConfigError, match="own FSDP1 unit"):
        with_expert_units(CustomPolicy(lambda module: False))
