"""Memory per GPU: model states (parameters, gradients, optimizer states) and buffers.

Two accounting conventions for mixed-precision training with Adam (bytes per parameter):

============  ==========  =========  ================  =====
convention    parameters  gradients  optimizer states  total
============  ==========  =========  ================  =====
``zero``      2 (bf16)    2 (bf16)   4 + 4 + 4 (fp32   16
                                     master, m, v)
``smp``       2 (bf16)    2 + 4      4 + 4 + 4         20
                          (+ fp32
                          copy)
============  ==========  =========  ================  =====

``zero`` is the ZeRO paper's count (Rajbhandari et al. 2020, K = 12) and the default: it is
also what FSDP2, meshtrain's runtime, keeps per parameter shard (an fp32 parameter, an fp32
gradient and Adam's two fp32 moments = 16 bytes). The 16-bit copies FSDP2 computes with exist
only while a unit is gathered, and the planner counts them as temporary buffers, so adding
them to the model states as well would count them twice. ``smp`` is SMP's guide's figure (it
books an fp32 gradient copy too); use it to compare with SMP's numbers. In fp32 training both
give 4 + 4 + 8 = 16. Without Adam, the 8 bytes of moments become 4 (SGD with momentum) or 0.

FSDP2 pads each sharded tensor to ``ceil(dim / shard) * shard`` rows, so per-rank bytes use
``ceil``: a rank holds at most that much, and on evenly divisible shapes it is exact.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Literal

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.contract.errors import ConfigError
from meshtrain.plan.activations import ACT_BYTES
from meshtrain.plan.models import ModelSpec, ParamGroup, param_groups

Convention = Literal["zero", "smp"]
OPTIMIZER_STATE_BYTES = {"adamw": 8, "adam": 8, "sgd_momentum": 4, "sgd": 0}
REDUCE_BYTES = 4
"""meshtrain's runtime reduces gradients in fp32 (MixedPrecisionPolicy reduce_dtype)."""
DEFAULT_CONVENTION: Convention = "zero"


@dataclass(frozen=True)
class Training:
    """What one optimizer step processes and with which numerics."""

    seq_len: int = 4096
    micro_batch: int = 1
    precision: str = "bf16"
    optimizer: str = "adamw"
    convention: Convention = DEFAULT_CONVENTION
    compute_efficiency: float = 0.4
    """Fraction of the GPU's peak FLOP/s the matmuls reach (used to rank layouts only)."""
    fused_optimizer: bool = False
    """torch's fused Adam (`fused=True`) needs no step buffer; the default foreach one does."""
    optimizer_offload: bool = False
    """The optimizer's states and step live in host memory (a script's own offloaded
    optimizer; FSDP2's `cpu_offload` moves parameters and gradients too)."""
    decoder_seq_len: int | None = None
    """Encoder-decoder models: the decoder's (labels') length; None: `seq_len`."""

    def __post_init__(self) -> None:
        if self.decoder_seq_len is not None and self.decoder_seq_len < 1:
            raise ConfigError(f"decoder_seq_len={self.decoder_seq_len} must be at least 1.")
        if self.seq_len < 1 or self.micro_batch < 1:
            raise ConfigError(f"seq_len={self.seq_len} and micro_batch={self.micro_batch} must "
                              "be at least 1.")
        if self.precision not in ACT_BYTES:
            raise ConfigError(f"precision={self.precision!r}: use bf16, fp16 or fp32.")
        if self.optimizer not in OPTIMIZER_STATE_BYTES:
            raise ConfigError(f"optimizer={self.optimizer!r}: use one of "
                              f"{', '.join(OPTIMIZER_STATE_BYTES)}.")
        if self.convention not in ("zero", "smp"):
            raise ConfigError(f"convention={self.convention!r}: use 'zero' (16 bytes/param with "
                              "Adam) or 'smp' (20 bytes/param).")
        if not 0 < self.compute_efficiency <= 1:
            raise ConfigError(f"compute_efficiency={self.compute_efficiency} must be in (0, 1].")

    @property
    def compute_bytes(self) -> int:
        return ACT_BYTES[self.precision]

    @property
    def mixed(self) -> bool:
        return self.precision != "fp32"


@dataclass(frozen=True)
class _StateSplit:
    """Parameters, gradients and optimizer states, and their sum."""

    parameters: int
    gradients: int
    optimizer_states: int

    @property
    def total(self) -> int:
        return self.parameters + self.gradients + self.optimizer_states


@dataclass(frozen=True)
class BytesPerParam(_StateSplit):
    """A convention's bytes per parameter."""


def bytes_per_param(training: Training) -> BytesPerParam:
    """The convention's bytes per parameter (see the module docstring)."""
    moments = OPTIMIZER_STATE_BYTES[training.optimizer]
    if not training.mixed:
        return BytesPerParam(4, 4, moments)
    extra_grad = 4 if training.convention == "smp" else 0
    return BytesPerParam(2, 2 + extra_grad, 4 + moments)


@dataclass(frozen=True)
class ModelStateBytes(_StateSplit):
    """Per-GPU bytes of parameters, gradients and optimizer states."""


def expert_shard_degree(shard: int, tp: int, ep: int) -> int:
    """Ranks an expert tensor is FSDP-sharded over: ``shard / ep``, and with TP x EP (the EP
    group folded over shard x tp) ``shard x tp / ep``; without EP, the shard group."""
    if ep == 1:
        return shard
    return shard * tp // ep


def local_shape(group: ParamGroup, tp: int, ep: int) -> list[int]:
    """One tensor of `group` on one rank after TP and EP, before FSDP (ceil on uneven splits).

    With EP, experts are split over ranks whole (no TP inside an expert, as the runtime)."""
    shape = list(group.shape)
    if group.tp_dim is not None and not (group.expert and ep > 1):
        shape[group.tp_dim] = math.ceil(shape[group.tp_dim] / tp)
    if group.expert:
        shape[0] = math.ceil(shape[0] / ep)
    return shape


def _sharded_numel(shape: list[int], dim: int, shard: int) -> int:
    rows = math.ceil(shape[dim] / shard)
    return rows * math.prod(shape) // shape[dim]


def group_shard_elements(group: ParamGroup, *, tp: int, ep: int, shard: int) -> int:
    """Elements one rank holds of one tensor of `group` (FSDP2-padded, so a maximum).

    Non-expert tensors are sharded on dim 0 over the `shard` group. Expert tensors (experts in
    dim 0, split `ep` ways) are sharded over `expert_shard_degree` ranks: on dim 1 when it divides
    evenly, else on dim 0 (the runtime's ``shard_experts_with_fsdp``, after torchtitan).
    """
    local = local_shape(group, tp, ep)
    if not group.expert:
        return _sharded_numel(local, 0, shard)
    expert_shard = expert_shard_degree(shard, tp, ep)
    dim = 1 if local[1] % expert_shard == 0 else 0
    return _sharded_numel(local, dim, expert_shard)


def local_param_elements(
    model: ModelSpec, *, tensor_parallel_degree: int = 1, expert_parallel_degree: int = 1,
    shard_degree: int = 1,
) -> int:
    """Parameter elements one rank holds after TP, EP and FSDP sharding."""
    return sum(
        group.count * group_shard_elements(group, tp=tensor_parallel_degree,
                                           ep=expert_parallel_degree, shard=shard_degree)
        for group in param_groups(model)
    )


def model_state_bytes(
    model: ModelSpec, degrees: ResolvedDegrees, training: Training, *, cpu_offload: bool = False
) -> ModelStateBytes:
    """Per-GPU model-state bytes under `degrees` (FSDP2 keeps every strategy's states sharded
    over the shard group; no_shard is a shard group of one). With `cpu_offload` they live in
    host memory: 0 on the GPU.
    """
    if cpu_offload:
        return ModelStateBytes(0, 0, 0)
    elements = local_param_elements(
        model, tensor_parallel_degree=degrees.tensor_parallel_degree,
        expert_parallel_degree=degrees.expert_parallel_degree,
        shard_degree=degrees.hybrid_shard_degree,
    )
    per = bytes_per_param(training)
    return ModelStateBytes(elements * per.parameters, elements * per.gradients,
                           elements * per.optimizer_states)


def zero_stage_bytes(model: ModelSpec, data_parallel_degree: int, training: Training) -> dict:
    """ZeRO stages over `data_parallel_degree` GPUs (no TP), the ZeRO paper's arithmetic.

    ddp: nothing sharded (FSDP no_shard); zero1: optimizer states sharded; zero2: gradients
    too (shard_grad_op); zero3: parameters too (full_shard). Sharded parts are ceil(N / D).
    """
    n, d = model.num_params, data_parallel_degree
    per = bytes_per_param(training)
    shard = math.ceil(n / d)
    return {
        "data_parallel_degree": d,
        "ddp": n * per.total,
        "zero1": n * (per.parameters + per.gradients) + shard * per.optimizer_states,
        "zero2": n * per.parameters + shard * (per.gradients + per.optimizer_states),
        "zero3": shard * per.total,
    }


@dataclass(frozen=True)
class MemoryEstimate:
    """Per-GPU bytes of one layout; `peak_bytes` (the largest phase) excludes the reserve.

    `phases` (meshtrain.plan.phases.PhaseMemory: forward, loss, backward, optimizer_step) say
    what is live when; `states`, `activations`, `temporary` and `optimizer_step` are the
    summary the table and `--json` have always shown: the model states (the convention's
    split), the activations saved at the end of forward, the peak phase's buffers besides
    states and activations, and the optimizer's step buffer.
    """

    states: ModelStateBytes
    activations: float
    temporary: dict[str, float] = field(default_factory=dict)
    optimizer_step: float = 0.0
    reserve: int = 0
    phases: tuple[Any, ...] = ()

    @property
    def temporary_bytes(self) -> float:
        return sum(self.temporary.values())

    @property
    def peak_phase(self) -> Any:
        """The phase with the most bytes."""
        return max(self.phases, key=lambda phase: phase.total)

    @property
    def peak_bytes(self) -> float:
        """The largest phase's bytes on the GPU."""
        return self.peak_phase.total


def optimizer_step_bytes(model: ModelSpec, degrees: ResolvedDegrees, training: Training) -> int:
    """torch's foreach Adam allocates sqrt(v) for every local parameter (fp32) at the step."""
    if OPTIMIZER_STATE_BYTES[training.optimizer] < 8 or training.fused_optimizer:
        return 0
    return 4 * local_param_elements(
        model, tensor_parallel_degree=degrees.tensor_parallel_degree,
        expert_parallel_degree=degrees.expert_parallel_degree,
        shard_degree=degrees.hybrid_shard_degree,
    )


__all__ = [
    "DEFAULT_CONVENTION",
    "OPTIMIZER_STATE_BYTES",
    "BytesPerParam",
    "MemoryEstimate",
    "ModelStateBytes",
    "Training",
    "bytes_per_param",
    "group_shard_elements",
    "local_param_elements",
    "local_shape",
    "model_state_bytes",
    "optimizer_step_bytes",
    "zero_stage_bytes",
]
