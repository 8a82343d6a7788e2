"""The FSDP2 groups `transform()` builds, and their sizes on one rank."""

from __future__ import annotations

import math
from dataclasses import dataclass

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.plan.encdec import encdec_groups
from meshtrain.plan.memory import expert_shard_degree, group_shard_elements
from meshtrain.plan.models import ModelSpec, param_groups


@dataclass(frozen=True)
class FSDPGroups:
    """Unsharded elements (FSDP2-padded) one rank gathers per group, after TP and EP."""

    embedding: int
    block: int
    """One block's dense part (everything but routed experts under expert parallelism)."""
    experts: int
    """One block's local experts when they form their own group (expert parallelism)."""
    head: int
    root: int
    num_blocks: int
    sharded: int
    """Elements of every group's shard on this rank (the model states' element count)."""
    largest_shard: int
    """Elements of the largest single parameter shard on this rank."""
    all_blocks: int = 0
    """Unsharded elements of every block together (blocks of an encoder-decoder differ)."""
    single: bool = False
    """A shard group of one (no_shard): FSDP2 copies shards into the unsharded parameters
    without an all-gather or a flat buffer, and reduces without a collective."""
    shard: int = 1
    """Ranks of the sharding group (a group's sharded elements are its unsharded / shard)."""

    @property
    def block_total(self) -> int:
        return self.block + self.experts


def fsdp_groups(model: ModelSpec, degrees: ResolvedDegrees) -> FSDPGroups:
    """The groups `transform()` builds and their sizes on one rank.

    A tied input embedding lives in the root group (FSDP2 cannot put one parameter in two
    groups). `largest_layer_params` overrides one block's size (for models whose blocks differ,
    or when only the parameter count is known), scaled by tensor parallelism.
    """
    tp, ep, shard = (degrees.tensor_parallel_degree, degrees.expert_parallel_degree,
                     degrees.hybrid_shard_degree)
    sizes = {"embedding": 0, "layer": 0, "experts": 0, "head": 0, "root": 0}
    sharded = largest = 0
    for group in param_groups(model):
        one = group_shard_elements(group, tp=tp, ep=ep, shard=shard)
        largest = max(largest, one)
        local = group.count * one
        sharded += local
        width = expert_shard_degree(shard, tp, ep) if group.expert else shard
        unit = "experts" if group.expert and ep > 1 else group.unit
        if unit == "embedding" and model.tie_word_embeddings:
            unit = "root"
        sizes[unit] += local * width
    blocks = model.num_blocks
    block = sizes["layer"] / blocks
    if model.is_encoder_decoder:  # a decoder block (cross-attention too) is the largest
        block = sum(group_shard_elements(g, tp=tp, ep=ep, shard=shard) * g.count * shard
                    for g in encdec_groups(model, decoder_block_only=True))
    if model.largest_layer_params is not None:
        block = model.largest_layer_params / tp
    return FSDPGroups(embedding=sizes["embedding"], block=math.ceil(block),
                      experts=math.ceil(sizes["experts"] / blocks), head=sizes["head"],
                      root=sizes["root"], num_blocks=blocks, sharded=sharded,
                      largest_shard=largest, all_blocks=sizes["layer"] + sizes["experts"],
                      single=shard == 1, shard=shard)


__all__ = ["FSDPGroups", "fsdp_groups"]
