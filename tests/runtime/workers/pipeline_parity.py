"""Pipeline-parallel layouts on 4 gloo ranks vs one process, in one torchrun launch.

Every layout trains its models (a tiny HF Llama and the GPT-2-style plain module of
pipeline_models.py everywhere; HF Mistral with a 3-token sliding window and HF Mixtral with
expert parallelism where named) for STEPS steps of AdamW with
``meshtrain_runtime.forward_backward``; each rank reports its losses (the global mean: the
average over every rank of the value forward_backward returned). Rank 0 also reports the
single-process reference (the same global batch per step, ``fn(model(x), y).backward()``).
Every rank reports the refusals: models that cannot be split (one per reason), fewer blocks
than stages, a batch not divisible by microbatches, a direct call.
tests/runtime/test_pipeline_parity.py asserts on the records.
"""

from __future__ import annotations

import os
import sys
from typing import Any

import torch
import torch.distributed as dist
from pipeline_models import GPT_TP_PLAN, HF_TINY, UNSPLITTABLE, VOCAB, build_gpt
from report import report
from torch import nn
from torch.distributed.fsdp import FSDPModule
from transformers import LlamaConfig, LlamaForCausalLM

import meshtrain_runtime as mr
from meshtrain.errors import ConfigError

SEQ, GLOBAL_BATCH, STEPS, LR = 9, 8, 4, 1e-2
CLIP = 0.05  # small enough that every step clips: the norm is the whole model's
BOTH = ("llama", "gpt")
LAYOUTS: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "gpipe_pp2": ({"pipeline_schedule": "GPipe", "microbatches": 2, "hybrid_shard_degree": 1},
                  BOTH),
    "1f1b_pp2": ({"pipeline_schedule": "1F1B", "microbatches": 4, "hybrid_shard_degree": 1},
                 (*BOTH, "mistral_window", "mixtral")),
    "interleaved_pp2": ({"pipeline_schedule": "Interleaved1F1B", "microbatches": 4,
                         "hybrid_shard_degree": 1}, BOTH),
    "looped_bfs_pp2": ({"pipeline_schedule": "LoopedBFS", "microbatches": 2,
                        "hybrid_shard_degree": 1}, BOTH),
    "interleaved_zb_pp2": ({"pipeline_schedule": "InterleavedZeroBubble", "microbatches": 4,
                            "hybrid_shard_degree": 1}, BOTH),
    "zbv_pp2": ({"pipeline_schedule": "ZBVZeroBubble", "microbatches": 2,
                 "hybrid_shard_degree": 1}, BOTH),
    "1f1b_pp2_dp2_sharded": ({"microbatches": 2, "hybrid_shard_degree": 2}, BOTH),
    "1f1b_pp4": ({"pipeline_parallel_degree": 4, "microbatches": 4}, BOTH),
    "1f1b_pp2_checkpointing": ({"microbatches": 2, "activation_checkpointing": True}, BOTH),
    "1f1b_pp2_selective": ({"microbatches": 2, "activation_checkpointing": "selective"}, BOTH),
    # ZBVZeroBubble's split backward recomputes each block twice
    "zbv_pp2_checkpointing": ({"pipeline_schedule": "ZBVZeroBubble", "microbatches": 2,
                               "hybrid_shard_degree": 1, "activation_checkpointing": True},
                              BOTH),
    "1f1b_pp2_tp2": ({"microbatches": 2, "tensor_parallel_degree": 2}, BOTH),
    "1f1b_pp2_split_points": ({"microbatches": 2, "pipeline_split_points": [1],
                               "hybrid_shard_degree": 2}, BOTH),
    "1f1b_pp2_ep2": ({"microbatches": 2, "hybrid_shard_degree": 2,
                      "expert_parallel_degree": 2}, ("mixtral",)),
}
"""layout -> (parameters on top of pipeline_parallel_degree=2, the models it trains)."""


def build(name: str) -> nn.Module:
    if name == "gpt":
        return build_gpt()
    torch.manual_seed(0)
    if name == "llama":
        return LlamaForCausalLM(LlamaConfig(**HF_TINY))
    if name == "mistral_window":  # 3 tokens: rows of 8 attend less far than causal
        from transformers import MistralConfig, MistralForCausalLM
        return MistralForCausalLM(MistralConfig(**HF_TINY, sliding_window=3))
    from transformers import MixtralConfig, MixtralForCausalLM
    return MixtralForCausalLM(MixtralConfig(**HF_TINY, num_local_experts=4,
                                            num_experts_per_tok=2))


LLAMA_TP_PLAN = {f"model.layers.*.{path}": style for path, style in (
    ("self_attn.q_proj", "colwise"), ("self_attn.k_proj", "colwise"),
    ("self_attn.v_proj", "colwise"), ("self_attn.o_proj", "rowwise"),
    ("mlp.gate_proj", "colwise"), ("mlp.up_proj", "colwise"), ("mlp.down_proj", "rowwise"))}


def tp_plan(name: str, degree: int) -> dict[str, str] | None:
    """The plain module's plan; Llama's own (config.base_model_tp_plan) where transformers
    declares one (not 4.46: then the same plan, given)."""
    if degree == 1:
        return None
    if name == "gpt":
        return GPT_TP_PLAN
    return None if getattr(LlamaConfig(), "base_model_tp_plan", None) else LLAMA_TP_PLAN


def loss_fn(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    return nn.functional.cross_entropy(logits.reshape(-1, logits.size(-1)), targets.reshape(-1))


def data() -> torch.Tensor:
    generator = torch.Generator().manual_seed(7)
    return torch.randint(0, VOCAB, (STEPS * GLOBAL_BATCH, SEQ), generator=generator)


def reference(name: str) -> dict[str, list[float]]:
    """One process, the whole global batch per step."""
    model, tokens = build(name), data()
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    losses, norms = [], []
    for step in range(STEPS):
        batch = tokens[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        output = model(batch[:, :-1])
        loss = loss_fn(getattr(output, "logits", output), batch[:, 1:])
        loss.backward()
        norms.append(float(torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.item())
    return {"losses": losses, "norms": norms}


def run_layout(layout: str, name: str) -> None:
    params = {"pipeline_parallel_degree": 2, **LAYOUTS[layout][0]}
    mr.init(params)
    st = mr.state
    try:
        model = mr.transform(build(name), tp_plan=tp_plan(name, st.tensor_parallel_degree))
    except ConfigError as error:  # a refusal fails this case's test, not the whole launch
        report({"case": "layout", "layout": layout, "model": name, "error": str(error)})
        mr.reset()
        return
    optimizer = torch.optim.AdamW(model.parameters(), lr=LR)
    tokens = data()
    losses, returned, norms = [], [], []
    for step in range(STEPS):
        batch = tokens[step * GLOBAL_BATCH:(step + 1) * GLOBAL_BATCH]
        rows = batch.chunk(st.dp_size)[st.dp_rank]
        loss = mr.forward_backward(model, rows[:, :-1], rows[:, 1:], loss_fn=loss_fn)
        norms.append(float(mr.clip_grad_norm_(model, CLIP)))
        optimizer.step()
        optimizer.zero_grad()
        returned.append(float(loss))
        total = loss.clone()
        dist.all_reduce(total)
        losses.append(float(total) / st.world_size)
    report({"case": "layout", "layout": layout, "model": name, "losses": losses, "norms": norms,
            "returned": returned, "dp_rank": st.dp_rank, "pp_rank": st.pp_rank,
            "dtype": str(loss.dtype), "shape": list(loss.shape),
            "names": sorted(n for n, _ in model.named_parameters()),
            "fsdp_modules": sum(isinstance(m, FSDPModule) for m in model.modules())})
    mr.reset()


def refusal(case: str, params: dict[str, Any], action: Any) -> None:
    """Every rank reports whether `action` raised a ConfigError, and its message."""
    mr.init(params)
    try:
        action()
        record = {"case": case, "error": None}
    except ConfigError as error:
        record = {"case": case, "error": str(error)}
    report(record)
    mr.reset()


def report_refusals() -> None:
    base = {"pipeline_parallel_degree": 2, "microbatches": 4}
    for case, (cls, _) in UNSPLITTABLE.items():  # at transform(), on every rank
        refusal(case, base, lambda cls=cls: mr.transform(cls()))
    refusal("fewer_blocks", {"pipeline_parallel_degree": 4, "microbatches": 8,
                             "pipeline_schedule": "Interleaved1F1B"},
            lambda: mr.transform(build("gpt")))

    def uneven() -> None:
        model = mr.transform(build("gpt"))
        mr.forward_backward(model, data()[:6, :-1], data()[:6, 1:], loss_fn=loss_fn)

    refusal("uneven_batch", base, uneven)
    refusal("rank0_weights", base,
            lambda: mr.transform(build("gpt"), load_state_dict_from_rank0=True))
    refusal("direct_call", base, lambda: mr.transform(build("gpt"))(data()[:2]))
    refusal("hf_tied", base, lambda: mr.transform(LlamaForCausalLM(LlamaConfig(
        **{**HF_TINY, "tie_word_embeddings": True}))))


COMPILE_LAYOUTS = {  # launched on their own (``pipeline_parity.py compile``): inductor is costly
    "1f1b_pp2_compile": ({"microbatches": 2, "hybrid_shard_degree": 2, "compile": True}, BOTH),
}


def main_compile() -> None:
    """pp2 + compile (1F1B) on the GPT-2-style module and the HF Llama: inductor on CPU, tiny."""
    LAYOUTS.update(COMPILE_LAYOUTS)
    from torch._dynamo.utils import counters

    for name in BOTH:
        if os.environ.get("RANK", "0") == "0":
            report({"case": "reference", "model": name, **reference(name)})
        counters.clear()  # this model's graphs and breaks only
        run_layout("1f1b_pp2_compile", name)
        report({"case": "compile_stats", "model": name,
                "graphs": counters["stats"]["unique_graphs"],
                "graph_breaks": sum(counters["graph_break"].values()),
                "breaks": sorted(counters["graph_break"])[:5]})


def main() -> None:
    if os.environ.get("RANK", "0") == "0":
        for name in sorted({name for _, models in LAYOUTS.values() for name in models}):
            report({"case": "reference", "model": name, **reference(name)})
    for layout, (_, models) in LAYOUTS.items():
        for name in models:
            run_layout(layout, name)
    report_refusals()


if __name__ == "__main__":
    main_compile() if sys.argv[1:] == ["compile"] else main()
