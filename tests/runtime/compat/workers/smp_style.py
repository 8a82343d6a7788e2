"""A training script in SMP v2's style, run on 4 gloo ranks against a one-process reference.

The script part is what an SMP user writes: ``tsm.init``, a Hugging Face Llama from a tiny
config, ``tsm.transform``, FSDP1 ``FullyShardedDataParallel`` with a transformer auto-wrap
policy on ``TransformerLayer`` and no process group, ``apply_activation_checkpointing``, SMP's
sharded checkpoint (FSDP ``SHARDED_STATE_DICT`` per tp rank, written by replica 0 over
``model.process_group``) and SMP's local async checkpoint (``SM_LOCAL_STATE_DICT`` by
replication group). Each case reports per-step losses; the reference is the same model trained
on the whole batch in this process without any parallelism.
"""

from __future__ import annotations

import functools
import os
import sys
import tempfile
from pathlib import Path

import torch
import torch.distributed as dist

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "workers"))
from report import report

from meshtrain_runtime.compat import install_torch_sagemaker

install_torch_sagemaker()

import torch.sagemaker as tsm  # noqa: E402
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (  # noqa: E402
    apply_activation_checkpointing,
)
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP  # noqa: E402
from torch.distributed.fsdp import StateDictType  # noqa: E402
from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy  # noqa: E402
from torch.sagemaker.distributed.checkpoint.async_utils import AsyncCallsQueue  # noqa: E402
from torch.sagemaker.distributed.checkpoint.state_dict_loader import load  # noqa: E402
from torch.sagemaker.distributed.checkpoint.state_dict_saver import async_save, save  # noqa: E402
from torch.sagemaker.distributed.checkpoint.state_dict_utils import (  # noqa: E402
    SMStateDictType,
    init_optim_state,
    sm_state_dict_type,
)
from torch.sagemaker.grad_norm import clip_grad_norm_  # noqa: E402
from torch.sagemaker.moe.moe_config import MoEConfig  # noqa: E402
from torch.sagemaker.tensor_parallel.transformer import TransformerLayer  # noqa: E402
from torch.sagemaker.utils.process_group_utils import get_global_ranks  # noqa: E402
from transformers import (  # noqa: E402
    LlamaConfig,
    LlamaForCausalLM,
    MixtralConfig,
    MixtralForCausalLM,
)

BATCH, SEQ, VOCAB, STEPS = 4, 8, 64, 4  # resumed runs take 2 steps: Adam's state matters
MAX_NORM = 0.5  # below the gradient norms here (about 1.7-2.0), so every step is clipped
NORMS: list[float] = []  # total gradient norms clip_grad_norm_ returned, step by step
SAVE_AFTER = 2


def build_model(moe: bool = False) -> torch.nn.Module:
    torch.manual_seed(0)
    if moe:  # Mixtral: 4 experts, top-2 (softmax routing: each token's choice is its own)
        return MixtralForCausalLM(MixtralConfig(
            vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
            num_attention_heads=4, num_key_value_heads=2, num_local_experts=4,
            num_experts_per_tok=2, use_cache=False, tie_word_embeddings=False)).float()
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         use_cache=False, tie_word_embeddings=False)
    return LlamaForCausalLM(config).float()


def batch(step: int) -> torch.Tensor:
    return torch.randint(0, VOCAB, (BATCH, SEQ), generator=torch.Generator().manual_seed(step))


def reference_losses(moe: bool = False) -> list[float]:
    NORMS.clear()
    model = build_model(moe)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    losses = []
    for step in range(STEPS):
        ids = batch(step)
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        NORMS.append(torch.nn.utils.clip_grad_norm_(model.parameters(), MAX_NORM).item())
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return losses


def wrapped_model(params: dict) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The SMP script: init, transform, FSDP1 without a group, checkpointing, optimizer."""
    tsm.state.reset()
    tsm.init(params)
    if params.get("expert_parallel_degree", 1) > 1:  # AWS's MoE path: experts split over ep
        config = MoEConfig(smp_moe=True, moe_load_balancing="none")
        model = tsm.transform(build_model(moe=True), config=config)
    else:
        model = tsm.transform(build_model())
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={TransformerLayer})
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, TransformerLayer))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, step: int,
               state: object = None) -> float:
    state = state or tsm.state
    dp_rank, dp_size = state.dp_rank, state.dp_size
    per_rank = BATCH // dp_size
    ids = batch(step)[dp_rank * per_rank:(dp_rank + 1) * per_rank]
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    # as AWS's train_step; with FSDP1 + TP the split gradients are summed over tp, not the others
    NORMS.append(float(clip_grad_norm_(model, MAX_NORM)))
    optimizer.step()
    optimizer.zero_grad()
    detached = loss.detach()
    dist.all_reduce(detached)  # AWS's reduce_loss: tp ranks repeat their dp rank's loss
    return detached.item() / dist.get_world_size()


def sharded_dir(root: str) -> str:
    tp, ep = tsm.state.tensor_parallel_degree, tsm.state.expert_parallel_degree
    root = os.path.join(root, f"tp{tp}-{tsm.state.tp_rank}") if tp > 1 else root
    return os.path.join(root, f"ep{ep}-{tsm.state.ep_rank}") if ep > 1 else root


def save_sharded(model, optimizer, root: str, step: int) -> None:
    """AWS's _save_sharded: replica 0 writes, over the FSDP group, one folder per tp rank."""
    group = model.process_group
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer),
                 "total_steps": step}
    if tsm.state.ranker.get_rep_rank(dist.get_rank()) == 0:
        save(state, checkpoint_id=sharded_dir(root), process_group=group,
             coordinator_rank=min(get_global_ranks(group)))
    dist.barrier()


def load_sharded(model, optimizer, root: str) -> int:
    init_optim_state(optimizer)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {"model": model.state_dict(), "optimizer": FSDP.optim_state_dict(model, optimizer),
                 "total_steps": 0}
        load(state, checkpoint_id=sharded_dir(root), process_group=model.process_group,
             coordinator_rank=min(get_global_ranks(model.process_group)))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer,
                                                                 state["optimizer"]))
    return state["total_steps"]


def replication_group():
    mine = None
    for ranks in tsm.state.ranker.get_rep_groups():
        group = dist.new_group(ranks)
        if dist.get_rank() in ranks:
            mine = (ranks, group)
    return mine


def local_dir(root: str, model) -> str:
    return os.path.join(root, f"tp{tsm.state.tp_rank}_ep{tsm.state.ep_rank}_fsdp{model.rank}")


def save_local_async(model, optimizer, root: str, step: int) -> None:
    ranks, group = replication_group()
    queue = AsyncCallsQueue()
    with sm_state_dict_type(model, SMStateDictType.SM_LOCAL_STATE_DICT):
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "total_steps": step}
    async_save(state, checkpoint_id=local_dir(root, model), process_group=group,
               coordinator_rank=min(ranks), queue=queue)
    queue.maybe_finalize_async_calls(blocking=True, process_group=group)


def load_local(model, optimizer, root: str) -> int:
    ranks, group = replication_group()
    with sm_state_dict_type(model, SMStateDictType.SM_LOCAL_STATE_DICT):
        init_optim_state(optimizer, skip_empty_param=True)
        state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                 "total_steps": 0}
        load(state, checkpoint_id=local_dir(root, model), process_group=group,
             coordinator_rank=min(ranks))
    return state["total_steps"]


def state_fields(params: dict) -> dict:
    """Every tsm.state field this rank sees for `params` (groups as their global ranks)."""
    tsm.state.reset()
    tsm.init(params)
    st = tsm.state
    groups = {name: get_global_ranks(getattr(st, name)) for name in (
        "tp_process_group", "rep_rank_process_group", "world_process_group", "cp_process_group")}
    fields = {name: getattr(st, name) for name in (
        "rank", "world_size", "hybrid_shard_degree", "tensor_parallel_degree", "tp_size",
        "tp_rank", "expert_parallel_degree", "ep_size", "ep_rank", "context_parallel_degree",
        "cp_size", "cp_rank", "dp_rank", "dp_size", "sm_activation_offloading",
        "activation_loading_horizon", "random_seed")}
    ranker = st.ranker
    tracker = st.get_rng_state_tracker()
    with tracker.fork():
        draw = torch.rand(1).item()
    return {**fields, **groups, "rep_rank": ranker.get_rep_rank(dist.get_rank()),
            "rep_groups": ranker.get_rep_groups(), "tracker_draw": draw,
            "is_initialized": tsm.is_initialized(),
            "compat_groups_outside_world_mesh": compat_groups_outside_world_mesh()}


def compat_groups_outside_world_mesh() -> list[str]:
    """Process groups of SMP's FSDP1 / FSDP2 / TP meshes that the runtime's mesh lacks."""
    from meshtrain_runtime import state as runtime_state
    from meshtrain_runtime.compat.smp._fsdp import compat_meshes

    world = runtime_state.current().meshes
    own = {g.group_name for mesh in (world.layout, world.context, world.dp, world.replica)
           for g in mesh.get_all_groups()}
    compat = compat_meshes()
    used = {g.group_name for mesh in (compat.fsdp1, compat.fsdp2, compat.tp)
            if mesh is not None for g in mesh.get_all_groups()}
    return sorted(used - own)


def estimator_wins() -> dict:
    """SM_HP_MP_PARAMETERS (the estimator's parameters) beats the dict given to tsm.init."""
    os.environ["SM_HP_MP_PARAMETERS"] = '{"hybrid_shard_degree": 2}'
    try:
        tsm.state.reset()
        tsm.init({"hybrid_shard_degree": 4, "activation_loading_horizon": 3})
        return {"hybrid_shard_degree": tsm.state.hybrid_shard_degree,
                "activation_loading_horizon": tsm.state.activation_loading_horizon}
    finally:
        del os.environ["SM_HP_MP_PARAMETERS"]


def meshtrain_loads_shim_and_back(shim_root: str, root: str) -> dict:
    """SMP-API checkpoint -> meshtrain's load_checkpoint; meshtrain's save -> SMP-API load."""
    import meshtrain_runtime as mr

    tsm.state.reset()
    mr.init({"hybrid_shard_degree": 4})
    model = mr.transform(build_model())
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    mr.load_checkpoint(shim_root, model, optimizer)
    written = mr.save_checkpoint(root, model, optimizer, step=SAVE_AFTER)
    forward = train_step(model, optimizer, SAVE_AFTER, mr.state)
    mr.reset()
    model, optimizer = wrapped_model({"hybrid_shard_degree": 2})
    init_optim_state(optimizer)
    with FSDP.state_dict_type(model, StateDictType.SHARDED_STATE_DICT):
        state = {"model": model.state_dict(),
                 "optimizer": FSDP.optim_state_dict(model, optimizer)}
        load(state, checkpoint_id=str(written))
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(FSDP.optim_state_dict_to_load(model, optimizer,
                                                                 state["optimizer"]))
    return {"meshtrain_from_shim": [forward],
            "shim_from_meshtrain": [train_step(model, optimizer, SAVE_AFTER)]}


def fsdp2_without_mesh(params: dict) -> dict:
    """FSDP2 ``fully_shard`` with no mesh shards over SMP's group (2 replicas x 2 shards)."""
    from torch.distributed.fsdp import fully_shard

    tsm.state.reset()
    tsm.init(params)
    model = tsm.transform(build_model())
    for layer in model.model.layers:
        fully_shard(layer)
    fully_shard(model)
    mesh = model.model.embed_tokens.weight.device_mesh
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return {"mesh_shape": list(mesh.shape),
            "losses": [train_step(model, optimizer, step) for step in range(STEPS)]}


def run_layout(params: dict, roots: dict[str, str]) -> list[float]:
    NORMS.clear()
    model, optimizer = wrapped_model(params)
    losses = []
    for step in range(STEPS):
        if step == SAVE_AFTER:
            save_sharded(model, optimizer, roots["sharded"], step)
            save_local_async(model, optimizer, roots["local"], step)
        losses.append(train_step(model, optimizer, step))
    return losses


def resume(params: dict, root: str, kind: str) -> list[float]:
    model, optimizer = wrapped_model(params)
    loader = load_sharded if kind == "sharded" else load_local
    start = loader(model, optimizer, root)
    return [train_step(model, optimizer, step) for step in range(start, STEPS)]


def main() -> None:
    dist.init_process_group("gloo")  # as AWS's script does, before tsm.init
    shared = [tempfile.mkdtemp(prefix="smp-ckpt-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(shared, src=0)
    root = shared[0]
    hybrid = {"hybrid_shard_degree": 2}
    tp2 = {"tensor_parallel_degree": 2, "hybrid_shard_degree": 2}
    roots = {name: {kind: os.path.join(root, name, kind) for kind in ("sharded", "local")}
             for name in ("hybrid", "tp", "ep")}
    report({"case": "state_tp2_hybrid2", **state_fields(
        {**tp2, "random_seed": 7, "sm_activation_offloading": False})})
    report({"case": "state_hybrid2_x2", **state_fields(hybrid)})
    report({"case": "estimator_wins", **estimator_wins()})
    report({"case": "reference", "losses": reference_losses(), "norms": list(NORMS)})
    report({"case": "hybrid2", "losses": run_layout(hybrid, roots["hybrid"]), "norms": list(NORMS)})
    report({"case": "tp2", "losses": run_layout(tp2, roots["tp"]), "norms": list(NORMS)})
    report({"case": "fsdp2_hybrid2", **fsdp2_without_mesh(hybrid)})
    # FSDP1 with experts split over ep=2 (AWS's MoE scripts' path), against one process
    ep2 = {"hybrid_shard_degree": 4, "expert_parallel_degree": 2}
    report({"case": "moe_reference", "losses": reference_losses(moe=True), "norms": list(NORMS)})
    report({"case": "fsdp1_ep2", "losses": run_layout(ep2, roots["ep"]), "norms": list(NORMS)})
    report({"case": "resume_sharded_ep2",
            "losses": resume(ep2, roots["ep"]["sharded"], "sharded")})
    # sharded resume on another layout: saved on 2 replicas x 2 shards, resumed sharded over 4
    report({"case": "resume_sharded_hybrid_to_full4",
            "losses": resume({"hybrid_shard_degree": 4}, roots["hybrid"]["sharded"], "sharded")})
    report({"case": "resume_local_hybrid",
            "losses": resume(hybrid, roots["hybrid"]["local"], "local")})
    report({"case": "resume_sharded_tp2",
            "losses": resume(tp2, roots["tp"]["sharded"], "sharded")})
    report({"case": "resume_local_tp2", "losses": resume(tp2, roots["tp"]["local"], "local")})
    report({"case": "interop", **meshtrain_loads_shim_and_back(
        roots["hybrid"]["sharded"], os.path.join(root, "meshtrain"))})


if __name__ == "__main__":
    main()
