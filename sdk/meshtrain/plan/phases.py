"""Memory per GPU phase by phase: what torch and FSDP2 hold at each phase's high-water mark.

One training step of the runtime's layout (``transform()``: an FSDP2 group per block, one for
the input embedding, one for the output head that is not resharded after forward, the root
for the rest; under expert parallelism the experts of each block first, as their own group)
passes through four phases. Each phase's figure is the sum of what is allocated at its worst
moment; the step's peak is the largest phase.

Always there (steady state, from the second step on): the sharded parameters in their own
dtype (fp32: FSDP2 keeps the fp32 shard and casts a copy for compute) and the optimizer's
states. The sharded gradients exist only from backward to the end of the optimizer step:
``zero_grad(set_to_none=True)`` (torch's default) frees them after every step.

- **forward**: at the end of the last block's forward. Saved activations of every block (or
  their checkpoints, and the running checkpointed block's MLP intermediates, freed as they
  are used), the unsharded compute-dtype parameters of the block running, and its
  flat all-gather buffer, which FSDP2 keeps until the next group's copy-out (the "implicit
  prefetch" that overlaps one all-gather with the next copy-out): two blocks' worth.
- **loss**: the output head runs and the loss is computed. HF's causal-LM loss upcasts the
  logits to fp32 and ``cross_entropy`` keeps the fp32 log-softmax for backward. Worst of two
  moments: (a) forward of the loss: compute-dtype logits + their fp32 copy + the
  log-softmax, with the head's unsharded parameters and its still-held flat all-gather
  buffer; (b) the first backward kernels: the log-softmax, the gradient ``nll_loss`` writes
  into and the gradient ``log_softmax`` returns (3 fp32 [tokens, vocab]), with the head's
  unsharded parameters (not resharded after forward); the flat buffer and the
  compute-dtype logits are gone (the root's post-forward frees the one, nobody holds the
  other once the loss is returned).
- **backward**: the first block in backward. Worst of (a) its start: every activation still
  saved (a checkpointed block's recomputed activations too), this block's unsharded
  parameters and the next block's (prefetched: its flat all-gather buffer), the head's fp32
  reduce-scatter input, which FSDP2 keeps until the next group's reduce starts, and the
  gradients flowing through the block; (b) its end: its own activations freed, its unsharded
  gradients complete (compute dtype) beside the same buffers; (c) its reduce: unsharded
  gradients and their fp32 reduce-scatter input (the parameters are resharded first).
- **optimizer step**: the states, the complete sharded gradients and, for torch's default
  (foreach) AdamW, one fp32 temporary the size of the local parameters (``_foreach_sqrt`` of
  the second moment); ``fused=True`` needs none.

``cpu_offload`` is FSDP2's ``CPUOffloadPolicy``: sharded parameters, gradients, optimizer
states and the step run in host memory; the unsharded buffers stay on the GPU. Optimizer-only
offload (a script's own host-side optimizer, not a layout the runtime builds) moves only the
optimizer states and its step.

``reshard_after_forward`` (the runtime's key; by default the strategy's choice) decides whether
a group frees its unsharded parameters once its forward is done. False keeps every group's
unsharded parameters from its forward to its backward: ``shard_grad_op`` (ZeRO-2; also the
runtime's nearest layout to ZeRO-1), ``_hybrid_shard_zero2`` and ``no_shard`` (one rank, or a
shard group of one) by default, or any strategy with ``reshard_after_forward: false``. True frees
them (the output head and the root stay gathered: backward starts with them), and the
first block in backward then gathers again with the next one prefetched.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

from meshtrain.contract.degrees import ResolvedDegrees
from meshtrain.plan.activations import ActivationEstimate
from meshtrain.plan.encdec import decoder_seq_len
from meshtrain.plan.groups import FSDPGroups, fsdp_groups
from meshtrain.plan.memory import OPTIMIZER_STATE_BYTES, Training
from meshtrain.plan.models import ModelSpec
from meshtrain.plan.moments import (
    BEFORE_BLOCKS,
    PARAM_BYTES,
    BackwardSizes,
    StepSizes,
    allocated_block,
    backward_terms,
    forward_terms,
    loss_terms,
)

PHASES = ("forward", "loss", "backward", "optimizer_step")
Offload = Literal["none", "cpu_offload", "optimizer"]
_F32 = 4
_PARAM_BYTES = PARAM_BYTES
RESIDENT_TERMS = ("sharded_parameters", "optimizer_states", "sharded_gradients", "activations")
"""Terms that are model states or saved activations; the rest are a phase's buffers."""
_BEFORE_BLOCKS = BEFORE_BLOCKS


@dataclass(frozen=True)
class PhaseMemory:
    """One phase's bytes on the GPU at its high-water mark, by what holds them."""

    name: str
    terms: dict[str, float] = field(default_factory=dict)

    @property
    def total(self) -> float:
        return sum(self.terms.values())

    @property
    def largest_term(self) -> str:
        return max(self.terms, key=lambda key: self.terms[key])


def _step_buffer(groups: FSDPGroups, training: Training, on_gpu: bool) -> float:
    """torch's AdamW defaults to foreach on CUDA: ``_foreach_sqrt`` of every second moment at
    once (4 B per local parameter). On CPU it defaults to the per-tensor loop, whose
    ``exp_avg_sq.sqrt() / bias_correction2_sqrt`` briefly holds two fp32 copies of one tensor.
    Fused AdamW and optimizers without a second moment need none."""
    if OPTIMIZER_STATE_BYTES[training.optimizer] < 8 or training.fused_optimizer:
        return 0.0
    return _F32 * groups.sharded if on_gpu else 2 * _F32 * groups.largest_shard


def _step(model: ModelSpec, degrees: ResolvedDegrees, training: Training,
          offload: Offload, uses_fsdp: bool, on_gpu: bool, reshard: bool | None) -> StepSizes:
    groups = fsdp_groups(model, degrees)
    moments = OPTIMIZER_STATE_BYTES[training.optimizer]
    on_gpu_params = offload != "cpu_offload"
    on_gpu_optimizer = offload == "none"
    states = {
        "sharded_parameters": _PARAM_BYTES * groups.sharded if on_gpu_params else 0.0,
        "optimizer_states": moments * groups.sharded if on_gpu_optimizer else 0.0,
    }
    return StepSizes(c=training.compute_bytes if uses_fsdp else _PARAM_BYTES, groups=groups,
                 fsdp=uses_fsdp,
                 keep_gathered=not (degrees.reshard_after_forward if reshard is None
                                    else reshard),
                 states=states,
                 gradients=_PARAM_BYTES * groups.sharded if on_gpu_params else 0.0,
                 step_buffer=_step_buffer(groups, training, on_gpu) if on_gpu_optimizer
                 else 0.0, scratch=not on_gpu and degrees.hybrid_shard_degree > 1,
                 cpu_offload=offload == "cpu_offload", on_gpu=on_gpu)


def phase_memory(
    model: ModelSpec,
    degrees: ResolvedDegrees,
    training: Training,
    activations: ActivationEstimate,
    *,
    offload: Offload = "none",
    uses_fsdp: bool = True,
    loss_parallel: bool = False,
    on_gpu: bool = True,
    reshard_after_forward: bool | None = None,
) -> list[PhaseMemory]:
    """The four phases of one step on one rank (see the module docstring).

    `uses_fsdp` is False only where the runtime skips FSDP (one data-parallel rank under
    tensor or pipeline parallelism, fp32, no offload: see
    `meshtrain_runtime.parallelize.uses_fsdp`); `loss_parallel` keeps the
    logits split over the vocabulary; `on_gpu` False plans CPU ranks (the optimizer's
    per-tensor loop, see `_step_buffer`); `reshard_after_forward` is the runtime's key resolved
    (None: the strategy's default, `degrees.reshard_after_forward`).
    """
    step = _step(model, degrees, training, offload, uses_fsdp, on_gpu, reshard_after_forward)
    tokens_vocab = _tokens_vocab(model, degrees, training, loss_parallel)
    # A training loop holds its loss through the optimizer step (one allocator block).
    loss = allocated_block(activations.model_terms.get("loss", 0.0), on_gpu)
    return [
        PhaseMemory("forward", step.states | forward_terms(step, activations)),
        PhaseMemory("loss", step.states | loss_terms(step, activations, tokens_vocab)),
        PhaseMemory("backward", step.states | backward_terms(
            step, activations, _backward_sizes(step, model, degrees, training))),
        PhaseMemory("optimizer_step", step.states | {"sharded_gradients": step.gradients,
                                                     "optimizer_step_buffer": step.step_buffer,
                                                     "loss": loss}),
    ]


def _tokens_vocab(model: ModelSpec, degrees: ResolvedDegrees, training: Training,
                  loss_parallel: bool) -> float:
    tokens = training.micro_batch * decoder_seq_len(model, training) \
        / degrees.context_parallel_degree
    vocab = model.vocab_size / (degrees.tensor_parallel_degree if loss_parallel else 1)
    return tokens * vocab


def _backward_sizes(step: StepSizes, model: ModelSpec, degrees: ResolvedDegrees,
                    training: Training) -> BackwardSizes:
    tokens = training.micro_batch * decoder_seq_len(model, training) \
        / degrees.context_parallel_degree
    tp = degrees.tensor_parallel_degree
    intermediate = model.intermediate_size / tp
    g = step.groups
    return BackwardSizes(
        flowing=step.c * tokens * model.hidden_size,
        mlp_weight_gradient=step.c * model.hidden_size * intermediate if step.fsdp else 0.0,
        head_gradient=(_PARAM_BYTES * g.head / degrees.hybrid_shard_degree)
        if step.gradients else 0.0,
        mlp_intermediate=2 * step.c * training.micro_batch * training.seq_len
        / degrees.context_parallel_degree * intermediate,
        mlp_weights=min(g.block_total, 3 * model.hidden_size * intermediate))


def peak_phase(phases: list[PhaseMemory]) -> PhaseMemory:
    """The phase with the most bytes (the first of equals)."""
    return max(phases, key=lambda phase: phase.total)


__all__ = ["PHASES", "RESIDENT_TERMS", "FSDPGroups", "Offload", "PhaseMemory", "fsdp_groups",
           "peak_phase", "phase_memory"]
