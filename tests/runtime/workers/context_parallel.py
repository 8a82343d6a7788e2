"""Context-parallel layouts on 4 gloo ranks vs one process, in one torchrun launch (issue 31).

Every layout trains a tiny HF Llama and a plain module calling F.scaled_dot_product_attention
(context_parallel_models.py) for STEPS AdamW steps, both ways in:

- (a) the script splits each row with ``context_parallel_shard`` and calls the model itself:
  the Llama with HF's ``labels=`` (meshtrain shifts them over the whole sequence) and the
  positions the split returns, the plain module with position-aligned targets (SMP's flow at
  the end passes no positions: meshtrain injects the chunks' global position_ids);
- (b) ``forward_backward`` with full sequences and targets, the first IGNORED of each row -100.

Each rank reports the mean over every rank of its step losses (what a script would log);
rank 0 also reports the single-process references, the cp groups and the refusals.
tests/runtime/test_context_parallel.py asserts on the records.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from typing import Any

import torch
import torch.distributed as dist
from context_parallel_models import (
    LR,
    OTHER_HF,
    SDPA_TP_PLAN,
    STEPS,
    batch,
    build,
    build_other_hf,
    hf_labels_loss,
    logits_of,
    loss_fn,
    reference,
    targets_b,
)
from report import report

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError
from meshtrain_runtime.parallel.context import context_parallel_shard

LAYOUTS: dict[str, dict[str, Any]] = {
    "cp2_hsdp_p2p": {"context_parallel_degree": 2, "hybrid_shard_degree": 2},
    "cp4_p2p": {"context_parallel_degree": 4},
    "cp2_dp2_shard4_p2p": {"context_parallel_degree": 2},
    "cp2_tp2_p2p": {"context_parallel_degree": 2, "tensor_parallel_degree": 2},
    "cp2_checkpointing_p2p": {"context_parallel_degree": 2, "activation_checkpointing": True},
    "cp2_offloading_p2p": {"context_parallel_degree": 2, "activation_checkpointing": True,
                           "activation_offloading": True},
    "cp2_selective_p2p": {"context_parallel_degree": 2, "activation_checkpointing": "selective"},
    "cp2_all_gather": {"context_parallel_degree": 2, "cp_comm_type": "all_gather"},
    "cp2_a2a": {"context_parallel_degree": 2, "cp_comm_type": "a2a"},
    "cp4_all_gather": {"context_parallel_degree": 4, "cp_comm_type": "all_gather"},
    "cp2_tp2_sp_p2p": {"context_parallel_degree": 2, "tensor_parallel_degree": 2,
                       "sequence_parallel": True},  # the Llama only (HF's plan has SP norms)
    "cp2_tp2_a2a": {"context_parallel_degree": 2, "tensor_parallel_degree": 2,
                    "cp_comm_type": "a2a"},  # 1 key/value head per tp rank: repeated for a2a
}


def rows_of(step: int) -> torch.Tensor:
    st = mr.state
    return batch(step).chunk(st.dp_size)[st.dp_rank]


def step_a(model: torch.nn.Module, name: str, rows: torch.Tensor) -> torch.Tensor:
    st = mr.state
    if name == "llama":  # HF's labels=: the model shifts them, across chunk borders
        (ids,), positions = context_parallel_shard(rows[:, :-1], cp_rank=st.cp_rank,
                                                   cp_size=st.cp_size)
        loss = model(input_ids=ids, labels=ids, position_ids=positions).loss
    else:
        (x, y), _ = context_parallel_shard(rows[:, :-1], rows[:, 1:], cp_rank=st.cp_rank,
                                           cp_size=st.cp_size)
        loss = loss_fn(logits_of(model(x)), y)
    loss.backward()
    return loss.detach()


def transformed(name: str) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    tp_plan = SDPA_TP_PLAN if name == "custom" and mr.state.tensor_parallel_degree > 1 else None
    model = mr.transform(build(name), tp_plan=tp_plan)
    return model, torch.optim.AdamW(model.parameters(), lr=LR)


def train_step(model: torch.nn.Module, optimizer: torch.optim.Optimizer, name: str, way: str,
               step: int) -> tuple[float, float]:
    """One step; (what this rank's loss was, its mean over every rank)."""
    rows = rows_of(step)
    if way == "a":
        loss = step_a(model, name, rows)
    else:
        loss = mr.forward_backward(model, rows[:, :-1], targets_b(rows), loss_fn=loss_fn)
    optimizer.step()
    optimizer.zero_grad()
    total = loss.clone()
    dist.all_reduce(total)
    return float(loss), float(total) / mr.state.world_size


def train(layout: str, name: str, way: str) -> None:
    st = mr.state
    model, optimizer = transformed(name)
    returned, losses = zip(*(train_step(model, optimizer, name, way, step)
                             for step in range(STEPS)), strict=True)
    report({"case": "layout", "layout": layout, "model": name, "way": way,
            "losses": list(losses), "returned": list(returned), "dp_rank": st.dp_rank,
            "cp_rank": st.cp_rank})


def run_resume(layout: str) -> None:
    """Way (b) on the Llama: 1 step, save_checkpoint, a fresh model loads it, 2 more steps."""
    mr.init(LAYOUTS[layout])
    holder = [tempfile.mkdtemp(prefix="cp-resume-") if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(holder)
    model, optimizer = transformed("llama")
    losses = [train_step(model, optimizer, "llama", "b", 0)[1]]
    mr.save_checkpoint(holder[0], model, optimizer, step=1)
    model, optimizer = transformed("llama")
    mr.load_checkpoint(holder[0], model, optimizer)
    losses += [train_step(model, optimizer, "llama", "b", step)[1] for step in (1, 2)]
    report({"case": "resume", "layout": layout, "losses": losses})
    dist.barrier()
    if dist.get_rank() == 0:
        shutil.rmtree(holder[0])
    mr.reset()


def run_layout(layout: str) -> None:
    mr.init(LAYOUTS[layout])
    st = mr.state
    report({"case": "groups", "layout": layout, "cp_rank": st.cp_rank, "cp_size": st.cp_size,
            "context_parallel_degree": st.context_parallel_degree, "dp_rank": st.dp_rank,
            "dp_size": st.dp_size,
            "cp_ranks": dist.get_process_group_ranks(st.cp_process_group)})
    for name in ("llama",) if "_sp_" in layout else ("llama", "custom"):
        for way in ("a", "b"):
            train(layout, name, way)
    for name in OTHER_HF if layout == "cp2_dp2_shard4_p2p" else ():
        train(layout, name, "b")
    mr.reset()


def run_smp() -> None:
    """SMP's flow: tsm.init, tsm.transform(cp_comm_type=...), FSDP1 without a group, the
    script's own checkpoint wrappers, AWS's batch split for the cp rank and HF labels=."""
    import functools

    from meshtrain_runtime.compat import install_torch_sagemaker

    install_torch_sagemaker()
    import torch.sagemaker as tsm
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import (
        apply_activation_checkpointing,
    )
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.wrap import transformer_auto_wrap_policy
    from torch.sagemaker.tensor_parallel.transformer import TransformerLayer

    tsm.state.reset()
    tsm.init({"context_parallel_degree": 2})
    model = tsm.transform(build("llama"), cp_comm_type="all_gather")
    policy = functools.partial(transformer_auto_wrap_policy,
                               transformer_layer_cls={TransformerLayer})
    model = FSDP(model, auto_wrap_policy=policy, use_orig_params=True)
    apply_activation_checkpointing(model, check_fn=lambda m: isinstance(m, TransformerLayer))
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    cp_rank, cp_size = tsm.state.cp_rank, tsm.state.cp_size
    dp_rank = dist.get_rank() // cp_size  # AWS: rank // (tp x cp)
    losses = []
    for step in range(STEPS):
        rows = batch(step).chunk(dist.get_world_size() // cp_size)[dp_rank]
        (ids,), _ = context_parallel_shard(rows[:, :-1], cp_rank=cp_rank, cp_size=cp_size)
        loss = hf_labels_loss(model, ids)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        total = loss.detach().clone()
        dist.all_reduce(total)
        losses.append(float(total) / dist.get_world_size())
    report({"case": "smp", "losses": losses, "cp_rank": cp_rank, "cp_size": cp_size,
            "context_parallel_degree": tsm.state.context_parallel_degree})
    try:
        tsm.transform(build("custom"), cp_comm_type="ring")
        error = None
    except ConfigError as refused:
        error = str(refused)
    report({"case": "smp_comm_type", "error": error})
    tsm.state.reset()


def refusal(case: str, params: dict[str, Any], action: Any) -> None:
    mr.init(params)
    try:
        action()
        record = {"case": case, "error": None}
    except ConfigError as error:
        record = {"case": case, "error": str(error)}
    if dist.get_rank() == 0:
        report(record)
    mr.reset()


def report_refusals() -> None:
    cp4 = {"context_parallel_degree": 4}

    def odd_sequence() -> None:
        model = mr.transform(build("custom"))
        rows = batch(0)[:, :-2]  # inputs of 14 tokens: not a multiple of 2 x 4
        mr.forward_backward(model, rows[:, :-1], rows[:, 1:], loss_fn=loss_fn)

    refusal("a2a_heads", {**cp4, "cp_comm_type": "a2a"}, lambda: mr.transform(build("llama2")))
    refusal("odd_sequence", cp4, odd_sequence)
    refusal("comm_type", cp4, lambda: mr.transform(build("custom"), cp_comm_type="ring"))

    def padding_mask() -> None:
        model = mr.transform(build("llama"))
        ids = batch(0)[:, :8]
        model(input_ids=ids, attention_mask=torch.zeros_like(ids))

    refusal("padding_mask", cp4, padding_mask)

    def short_window() -> None:
        model = mr.transform(build_other_hf("mistral", sliding_window=8))
        rows = batch(0)
        mr.forward_backward(model, rows[:, :-1], rows[:, 1:], loss_fn=loss_fn)

    refusal("sliding_window", cp4, short_window)


def main() -> None:
    torch.set_num_threads(1)
    if os.environ.get("RANK", "0") == "0":
        for name in ("llama", "custom"):
            for way in ("a", "b"):
                report({"case": "reference", "model": name, "way": way,
                        "losses": reference(name, way)})
        for name in OTHER_HF:
            report({"case": "reference", "model": name, "way": "b",
                    "losses": reference(name, "b")})
    for layout in LAYOUTS:
        run_layout(layout)
    run_resume("cp2_dp2_shard4_p2p")
    run_smp()
    report_refusals()


if __name__ == "__main__":
    main()
