"""Resolving SMP degrees against a real world size, with the arithmetic in every error.

Rank layout (one mesh, outermost first): ``pp x replicate x shard x tp``. Every degree but the
pipeline's counts ranks within one pipeline stage (world / pp ranks): ``hybrid_shard_degree``
included, and the context-parallel group is carved out of it (``shard = shard_mod_cp x cp``),
as is expert parallelism (``shard = shard_mod_ep x ep``, torchtitan's layout). Tensor-parallel
groups are contiguous global ranks (``tp_rank = rank % tp``), as in SMP's example scripts. The
axis names, the rank formula and the mesh shapes are in ``meshtrain.contract.mesh_axes``.
"""

from __future__ import annotations

from dataclasses import dataclass

from meshtrain.contract._messages import divisors_text
from meshtrain.contract.distribution import SMPParameters
from meshtrain.contract.errors import ConfigError

_RESHARD_AFTER_FORWARD = {
    "full_shard": True,
    "hybrid_shard": True,
    "shard_grad_op": False,
    "_hybrid_shard_zero2": False,
    "no_shard": False,
}


@dataclass(frozen=True)
class ResolvedDegrees:
    """Validated parallel sizes for one world: ``pp x replicate x shard x tp`` is the world size,
    cp and ep divide the sharding group (an internal invariant, checked on construction)."""

    world_size: int
    replicate_degree: int
    hybrid_shard_degree: int
    tensor_parallel_degree: int
    context_parallel_degree: int
    expert_parallel_degree: int
    sharding_strategy: str
    pipeline_parallel_degree: int = 1

    def __post_init__(self) -> None:
        stage = self.replicate_degree * self.hybrid_shard_degree * self.tensor_parallel_degree
        if self.pipeline_parallel_degree * stage != self.world_size:
            raise ValueError(
                f"pp {self.pipeline_parallel_degree} x replicate {self.replicate_degree} x shard "
                f"{self.hybrid_shard_degree} x tp {self.tensor_parallel_degree} is not the world "
                f"size {self.world_size}"
            )
        # cp is carved out of shard; ep out of shard x tp (folded over tp ranks with TP)
        shard, tp = self.hybrid_shard_degree, self.tensor_parallel_degree
        for name, carved, group in (("cp", self.context_parallel_degree, shard),
                                    ("ep", self.expert_parallel_degree, shard * tp)):
            if group % carved:
                raise ValueError(f"{name} {carved} does not divide the sharding group {group}")

    @property
    def data_parallel_degree(self) -> int:
        """The ranks of one stage that hold the same parameters and reduce gradients together
        (``replicate x shard``, context-parallel ranks included)."""
        return self.replicate_degree * self.hybrid_shard_degree

    @property
    def dp_size(self) -> int:
        """Ranks that see different rows of data: world / (pp x tp x cp)."""
        return self.world_size // (
            self.pipeline_parallel_degree * self.tensor_parallel_degree
            * self.context_parallel_degree
        )

    @property
    def reshard_after_forward(self) -> bool:
        return _RESHARD_AFTER_FORWARD[self.sharding_strategy]


def resolve_degrees(
    params: SMPParameters,
    world_size: int,
    *,
    ranks_per_host: int | None = None,
    world_description: str = "",
) -> ResolvedDegrees:
    """Resolve `params` against `world_size` ranks; raise ConfigError with the arithmetic.

    `world_description` (e.g. "2 hosts x 4 processes") is quoted in errors.
    """
    where = f"world size {world_size}" + (f" ({world_description})" if world_description else "")
    pp = _check_divides("pipeline_parallel_degree", params.pipeline_parallel_degree, world_size,
                        where)
    stage_world = world_size // pp
    if pp > 1:  # every other degree counts ranks within one stage
        where = f"one stage's {stage_world} ranks ({where} / pipeline_parallel_degree={pp})"
    tp = _check_divides("tensor_parallel_degree", params.tensor_parallel_degree, stage_world,
                        where)
    dp = stage_world // tp
    shard = _resolve_shard(params, dp, tp, where, ranks_per_host)
    cp = params.context_parallel_degree
    if cp > shard or shard % cp:
        raise ConfigError(
            f"context_parallel_degree={cp} must divide the resolved hybrid_shard_degree={shard} "
            f"({where}): the context-parallel group is carved out of the sharding group. "
            f"Use context_parallel_degree {divisors_text(shard)}."
        )
    ep = params.expert_parallel_degree
    if (shard * tp) % ep:  # with TP the EP group is folded over shard x tp ranks
        of_tp = f" x tensor_parallel_degree={tp} = {shard * tp}" if tp > 1 else ""
        raise ConfigError(
            f"expert_parallel_degree={ep} must divide the resolved hybrid_shard_degree={shard}"
            f"{of_tp} ({where}): experts are split within the sharding group. Use "
            f"expert_parallel_degree {divisors_text(shard * tp)}, or a hybrid_shard_degree that "
            f"is a multiple of {ep}."
        )
    strategy = _resolve_strategy(params.sharding_strategy, shard, dp)
    return ResolvedDegrees(
        world_size=world_size,
        replicate_degree=dp // shard,
        hybrid_shard_degree=shard,
        tensor_parallel_degree=tp,
        context_parallel_degree=cp,
        expert_parallel_degree=ep,
        sharding_strategy=strategy,
        pipeline_parallel_degree=pp,
    )


def _check_divides(name: str, degree: int, world_size: int, where: str) -> int:
    if degree > world_size or world_size % degree:
        raise ConfigError(
            f"{name}={degree} does not divide {where}. Use {divisors_text(world_size)}."
        )
    return degree


def _resolve_shard(
    params: SMPParameters, dp: int, tp: int, where: str, ranks_per_host: int | None
) -> int:
    hsd = params.hybrid_shard_degree
    if hsd == 0:
        hybrid = params.sharding_strategy in ("hybrid_shard", "_hybrid_shard_zero2")
        if hybrid and ranks_per_host and ranks_per_host % tp == 0:
            return min(ranks_per_host // tp, dp)  # SMP H0: hybrid strategies shard within a host
        return 1 if params.sharding_strategy == "no_shard" else dp
    if hsd > dp or dp % hsd:
        tp_part = f" / tensor_parallel_degree={tp}" if tp > 1 else ""
        raise ConfigError(
            f"hybrid_shard_degree={hsd} does not divide the data-parallel size {dp} "
            f"({where}{tp_part}). Use {divisors_text(dp)}, or 0 for the largest possible."
        )
    return hsd


def _resolve_strategy(strategy: str | None, shard: int, dp: int) -> str:
    if strategy is None:
        if shard == 1:
            return "no_shard"
        return "full_shard" if shard == dp else "hybrid_shard"
    if strategy == "full_shard" and shard != dp:
        return "hybrid_shard"  # SMP H2: a degree below the data-parallel size means hybrid
    if strategy == "shard_grad_op" and shard != dp:
        return "_hybrid_shard_zero2"
    return strategy
