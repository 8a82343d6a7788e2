"""Context-parallel attention (issue 31): exact attention over sequences split across cp ranks.

One launch of 4 gloo ranks (tests/runtime/workers/context_attention.py) runs every case: cp2
(two groups of 2 ranks side by side) and cp4, each comm_type (p2p ring, all_gather, a2a
Ulysses), causal and full, both layouts, MHA and GQA; forward output and the gradients of q, k,
v against scaled_dot_product_attention over the whole sequence in one process, float32 within
1e-5 (the same tolerance as the house's loss parity; the errors measured are ~1e-6). Then
sdpa_dispatch on a plain module, shard/unshard, and the ConfigErrors. The rest are unit tests
of the layout and of the blockwise math, in this process.
"""

from __future__ import annotations

import itertools
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.nn.functional as F

import meshtrain_runtime
from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.parallel.context import blockwise, context_parallel_shard, local_positions
from meshtrain_runtime.parallel.context.blockwise import (
    Accumulator,
    backward_blocks,
    plan_blocks,
)
from meshtrain_runtime.parallel.context.dispatch import is_local_causal_mask

TOLERANCE = 1e-5  # float32, forward and every gradient (max abs error)
WORKER = Path(__file__).parent / "workers" / "context_attention.py"
COMMS = ["p2p", "all_gather", "a2a"]
LAYOUTS = ["load_balanced", "contiguous"]
ATTN_CASES = [
    f"attn/cp{cp}/{comm}/{mode}/{layout}/{heads}"
    for cp, comm, mode, layout, heads in itertools.product(
        [2, 4], COMMS, ["causal", "full"], LAYOUTS, ["mha", "gqa"])
] + [f"attn/cp1/{comm}/causal/load_balanced/gqa" for comm in COMMS]  # a group of one
DISPATCH_CASES = [f"dispatch/cp{cp}/{comm}" for cp in (2, 4) for comm in COMMS]
UNSHARD_CASES = [f"unshard/cp{cp}/{layout}" for cp in (2, 4) for layout in LAYOUTS]
ALL_CASES = [*ATTN_CASES, *DISPATCH_CASES, "mask/cp2", *UNSHARD_CASES, "refusals/cp2"]


@pytest.fixture(scope="module")
def records(torchrun) -> dict[str, dict[str, Any]]:
    found = torchrun(WORKER, 4, *ALL_CASES, timeout=300)
    return {r["case"]: r for r in found}


def record(records: dict[str, dict[str, Any]], case: str) -> dict[str, Any]:
    assert case in records, f"no record for {case}"
    assert "error" not in records[case], records[case]["error"]
    return records[case]


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", ATTN_CASES)
def test_attention_and_gradients_match_full_sdpa(records, case: str) -> None:
    r = record(records, case)
    assert r["grad_norm"] > 0.1  # the gradients compared are not trivially zero
    for name in ("out", "dq", "dk", "dv"):
        assert r[name] < TOLERANCE, (name, r)


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", [*DISPATCH_CASES, "mask/cp2"])
def test_sdpa_dispatch_on_a_plain_module(records, case: str) -> None:
    r = record(records, case)
    assert r["out"] < TOLERANCE and r["grads"] < TOLERANCE, r
    # without the mode the module attends within its chunks only: far off
    assert r["without_dispatch"] > 1e-2


@pytest.mark.multiprocess
@pytest.mark.parametrize("case", UNSHARD_CASES)
def test_unshard_restores_the_global_order(records, case: str) -> None:
    assert record(records, case)["equal"] is True


@pytest.mark.multiprocess
def test_refusals_on_ranks_state_the_arithmetic(records) -> None:
    messages = record(records, "refusals/cp2")["messages"]
    assert "3 heads are not divisible by context_parallel_degree=2 (3 % 2 = 1)" in (
        messages["a2a_heads"])
    assert "no attn_mask" in messages["attn_mask"]
    assert "no attn_mask" in messages["other_mask"]  # not causal over local tokens
    assert "dropout_p=0.1" in messages["dropout"]
    assert "'ring' is not one of" in messages["comm_type"]
    assert "3 % 2 = 1" in messages["odd_local_seq"]


# ---- unit tests, no launch -------------------------------------------------------------------


def test_load_balanced_positions_are_smp_chunks() -> None:
    # 16 tokens, cp 2: 4 chunks of 4; rank 0 holds chunks 0 and 3, rank 1 chunks 1 and 2
    assert local_positions(8, 0, 2, "load_balanced").tolist() == [0, 1, 2, 3, 12, 13, 14, 15]
    assert local_positions(8, 1, 2, "load_balanced").tolist() == [4, 5, 6, 7, 8, 9, 10, 11]
    assert local_positions(4, 3, 4, "load_balanced").tolist() == [6, 7, 8, 9]
    assert local_positions(4, 1, 4, "contiguous").tolist() == [4, 5, 6, 7]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("cp", [1, 2, 4])
def test_shard_covers_the_sequence_once(layout: str, cp: int) -> None:
    ids = torch.arange(2 * 16).view(2, 16)
    hidden = torch.randn(2, 16, 3)
    seen = []
    for rank in range(cp):
        (local_ids, local_hidden), positions = context_parallel_shard(
            ids, hidden, seq_dim=1, cp_rank=rank, cp_size=cp, layout=layout)
        assert torch.equal(local_ids, ids[:, positions])
        assert torch.equal(local_hidden, hidden[:, positions])
        assert positions.dtype == torch.long and positions.shape == (16 // cp,)
        seen.extend(positions.tolist())
    assert sorted(seen) == list(range(16))


def test_shard_refuses_lengths_that_do_not_split() -> None:
    ids = torch.zeros(1, 10)
    with pytest.raises(ConfigError, match=r"10 is not divisible by 4 \(2 x cp = 2 x 2.*10 % 4 = 2"):
        context_parallel_shard(ids, cp_rank=0, cp_size=2)
    with pytest.raises(ConfigError, match=r"10 is not divisible by 4 \(cp = 4.*e\.g\. 12"):
        context_parallel_shard(ids, cp_rank=0, cp_size=4, layout="contiguous")
    with pytest.raises(ConfigError, match="cp_rank=2 is not a rank"):
        context_parallel_shard(ids, cp_rank=2, cp_size=2)
    with pytest.raises(ConfigError, match="different lengths"):
        context_parallel_shard(ids, torch.zeros(1, 12), cp_rank=0, cp_size=2)
    with pytest.raises(ConfigError, match="not a context-parallel layout"):
        context_parallel_shard(ids, cp_rank=0, cp_size=1, layout="zigzag")


def _causal_work(cp: int, layout: str) -> list[int]:
    """Score elements each rank computes under a causal mask (16 tokens per rank)."""
    seq = 16 * cp
    chunk = seq // (2 * cp if layout == "load_balanced" else cp)
    work = []
    for rank in range(cp):
        pos_q = local_positions(16, rank, cp, layout)
        work.append(sum(
            (b.q_end - b.q_start) * (b.k_end - b.k_start)
            for src in range(cp)
            for b in plan_blocks(pos_q, local_positions(16, src, cp, layout), chunk, True)))
    return work


def test_load_balanced_layout_balances_causal_work() -> None:
    assert len(set(_causal_work(4, "load_balanced"))) == 1
    contiguous = _causal_work(4, "contiguous")
    assert contiguous == sorted(contiguous) and contiguous[0] < contiguous[-1]


@pytest.mark.parametrize("layout", LAYOUTS)
@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("kernel", ["fused", "math"])
def test_blockwise_math_matches_sdpa_with_gradients(
    layout: str, causal: bool, kernel: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Every rank's blocks computed in this process (no communication): output and grads.
    "fused": torch's CPU flash kernels (the CPU path); "math": the matmul path other devices
    take, run here on the CPU."""
    if kernel == "math":
        monkeypatch.setattr(blockwise, "_fused", lambda q, block: False)
    torch.manual_seed(0)
    cp, seq = 4, 32
    q = torch.randn(2, 4, seq, 8, requires_grad=True)
    k, v = (torch.randn(2, 2, seq, 8, requires_grad=True) for _ in range(2))
    ref = F.scaled_dot_product_attention(q, k, v, is_causal=causal, enable_gqa=True)
    grad_out = torch.randn_like(ref)
    ref_grads = torch.autograd.grad(ref, (q, k, v), grad_out)
    chunk = seq // (2 * cp if layout == "load_balanced" else cp)
    shard = [context_parallel_shard(q.detach(), k.detach(), v.detach(), grad_out, seq_dim=2,
                                    cp_rank=r, cp_size=cp, layout=layout) for r in range(cp)]
    dk = torch.zeros_like(k)
    dv = torch.zeros_like(v)
    for (lq, _, _, lg), pos_q in shard:
        acc = Accumulator(lq, 8)
        plans = [(lk, lv, pos_k, plan_blocks(pos_q, pos_k, chunk, causal))
                 for (_, lk, lv, _), pos_k in shard]
        for lk, lv, _, blocks in plans:
            acc.attend(lq, lk, lv, blocks, 8 ** -0.5)
        assert (acc.out - ref.detach()[:, :, pos_q]).abs().max() < TOLERANCE
        dq = torch.zeros_like(lq)
        for lk, lv, pos_k, blocks in plans:
            g_q, g_k, g_v = backward_blocks(lq, lk, lv, lg, (acc.out, acc.lse), blocks,
                                            8 ** -0.5)
            dq += g_q
            dk[:, :, pos_k] += g_k
            dv[:, :, pos_k] += g_v
        assert (dq - ref_grads[0][:, :, pos_q]).abs().max() < TOLERANCE
    assert (dk - ref_grads[1]).abs().max() < TOLERANCE
    assert (dv - ref_grads[2]).abs().max() < TOLERANCE


def test_chunks_overlapping_in_part_get_an_element_mask() -> None:
    """Positions this package's layouts never make (a query chunk straddling key chunks)."""
    torch.manual_seed(0)
    q, k, v = torch.randn(1, 2, 4, 8), torch.randn(1, 2, 8, 8), torch.randn(1, 2, 8, 8)
    pos_q, pos_k = torch.arange(2, 6), torch.arange(8)
    blocks = plan_blocks(pos_q, pos_k, 4, True)
    assert [(b.k_start, b.k_end, b.mask is not None) for b in blocks] == [(0, 4, True),
                                                                           (4, 8, True)]
    acc = Accumulator(q, 8)
    acc.attend(q, k, v, blocks, 8 ** -0.5)
    mask = pos_k[None, :] <= pos_q[:, None]
    ref = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
    assert (acc.out - ref).abs().max() < TOLERANCE


def test_local_causal_mask_is_recognised_and_nothing_else() -> None:
    causal = torch.ones(4, 4, dtype=torch.bool).tril()
    additive = torch.zeros(4, 4).masked_fill(~causal, torch.finfo(torch.float32).min)
    assert is_local_causal_mask(causal, 4)
    assert is_local_causal_mask(causal[None, None].expand(2, 1, 4, 4), 4)
    assert is_local_causal_mask(additive, 4)
    assert is_local_causal_mask(torch.zeros(4, 4).masked_fill(~causal, float("-inf")), 4)
    assert not is_local_causal_mask(torch.ones(4, 4, dtype=torch.bool), 4)  # full
    padded = causal.clone()
    padded[:, 0] = False
    assert not is_local_causal_mask(padded, 4)  # padding
    assert not is_local_causal_mask(causal, 8)  # another length
    assert not is_local_causal_mask(additive + 1.0, 4)


def test_shard_defaults_to_this_process_cp_coordinates(monkeypatch: pytest.MonkeyPatch) -> None:
    # SMP's form, `context_parallel_shard(ids, labels, seq_dim=1)`: the rank and size are state's
    from types import SimpleNamespace

    from meshtrain_runtime import state

    ids = torch.arange(16).view(1, 16)
    with pytest.raises(RuntimeError, match="init"):
        meshtrain_runtime.context_parallel_shard(ids, seq_dim=1)
    monkeypatch.setattr(state, "_current", SimpleNamespace(cp_rank=1, cp_size=2))
    (local, labels), positions = meshtrain_runtime.context_parallel_shard(ids, ids + 100)
    assert local.tolist() == [[4, 5, 6, 7, 8, 9, 10, 11]]
    assert labels.tolist() == [[104, 105, 106, 107, 108, 109, 110, 111]]
    assert positions.tolist() == local[0].tolist()
