"""``forward_backward``: one training step's forward and backward, the same call for every layout.

Without pipelining it is ``fn(model(inputs), targets).backward()`` (with ``microbatches`` > 1:
gradient accumulation over equal chunks, the same gradients). With pipelining it runs torch's
schedule (torch.distributed.pipelining) over ``microbatches`` chunks: the first stage takes the
inputs, the last computes ``fn`` per microbatch, and the mean loss is sent from the last stage's
rank to every rank of the pipeline, so all ranks of one data-parallel rank return the same value.
With context parallelism (cp > 1) it takes FULL sequences, keeps this cp rank's chunks
(``context_parallel_shard``, SMP's load-balanced layout) and weights each chunk's loss by its
count of targets other than -100, so loss and gradients are one process's over whole sequences.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.distributed.pipelining import PipelineStage, schedules

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.pipeline_checks import SINGLE_STAGE_SCHEDULES
from meshtrain_runtime import fault
from meshtrain_runtime import state as runtime_state
from meshtrain_runtime.parallel.context import context_parallel_shard
from meshtrain_runtime.parallel.pipeline import PipelineModule

LossFn = Callable[[Any, torch.Tensor], torch.Tensor]
IGNORE_INDEX = -100  # cross-entropy's: targets that count for nothing


def forward_backward(
    model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor, *, loss_fn: LossFn
) -> torch.Tensor:
    """Run forward and backward on this data-parallel rank's rows; return the mean loss.

    `inputs` / `targets`: this data-parallel rank's rows (every pipeline / tensor-parallel rank
    of it passes the same rows); their first dimension must divide by ``microbatches``.
    `loss_fn(output, targets)` returns the mean loss of what it is given (`output` is the logits
    tensor; a Hugging Face output's ``.logits``). Returns a detached 0-dim float32 tensor: the
    equal-weight mean of `loss_fn` over the microbatches; the gradients are those of that mean.

    With ``context_parallel_degree > 1`` every cp rank passes the same full rows (its
    data-parallel rank's); targets are position-aligned (already shifted), sequence on dim 1,
    whose length divides by 2 x cp. Each chunk's `loss_fn` value is weighted by its targets
    other than -100 (cross-entropy's ignore_index), and every cp rank returns the loss over the
    whole rows.
    """
    st = runtime_state.current()
    microbatches = st.config.microbatches
    rows = inputs.shape[0]
    if rows % microbatches:
        raise ConfigError(
            f"forward_backward got {rows} rows but microbatches={microbatches}: {rows} is not "
            f"a multiple of {microbatches}. Pass a multiple of {microbatches} rows per "
            "data-parallel rank (the batch size), or change microbatches.")
    if isinstance(model, PipelineModule):
        return _pipelined(model, st, inputs, targets, loss_fn)
    if st.context_parallel_degree > 1:
        return _context_parallel(model, st, inputs, targets, loss_fn)
    return _accumulated(model, inputs, targets, loss_fn, microbatches)


def _logits(output: Any) -> Any:
    return output.logits if hasattr(output, "logits") else output


def _accumulated(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor,
                 loss_fn: LossFn, microbatches: int) -> torch.Tensor:
    total = torch.zeros((), dtype=torch.float32, device=inputs.device)
    chunks = zip(inputs.chunk(microbatches), targets.chunk(microbatches), strict=True)
    for index, (x, y) in enumerate(chunks):
        if isinstance(model, FSDPModule):  # reduce gradients once, after the last chunk
            model.set_requires_gradient_sync(index == microbatches - 1)
        loss = loss_fn(_logits(model(x)), y) / microbatches
        loss.backward()
        total += loss.detach().float()
    fault.note_loss(total)  # the step's JSON line with replica groups
    return total


def _context_parallel(model: nn.Module, st: runtime_state.RuntimeState, inputs: torch.Tensor,
                      targets: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    """Each microbatch: this cp rank's chunks, its loss weighted by its share of the targets.

    FSDP averages gradients over the cp ranks (they are in the sharding group), so a rank whose
    chunks hold n of the rows' N counted targets backpropagates loss x n x cp / N: the mean over
    the cp ranks is then sum(n x loss) / N, one process's mean over the whole rows.
    """
    microbatches, group = st.config.microbatches, st.cp_process_group
    total = torch.zeros((), dtype=torch.float32, device=inputs.device)
    chunks = zip(inputs.chunk(microbatches), targets.chunk(microbatches), strict=True)
    for index, (x, y) in enumerate(chunks):
        if isinstance(model, FSDPModule):  # reduce gradients once, after the last chunk
            model.set_requires_gradient_sync(index == microbatches - 1)
        (x, y), _ = context_parallel_shard(x, y, seq_dim=1, cp_rank=st.cp_rank,
                                           cp_size=st.cp_size)
        counted = (y != IGNORE_INDEX).sum().to(torch.float32)
        whole = counted.clone()
        dist.all_reduce(whole, group=group)
        share = counted / whole.clamp(min=1) / microbatches
        logits = _logits(model(x))
        if counted.item() == 0:  # a mean over no targets is nan: contribute zero gradients
            (logits.sum() * 0).backward()
            continue
        loss = loss_fn(logits, y)
        (loss * share * st.cp_size).backward()
        total += loss.detach().float() * share
    dist.all_reduce(total, group=group)
    return total


class _Runner:
    """The torch stages and schedule of one PipelineModule (built at its first step)."""

    def __init__(self, model: PipelineModule, st: runtime_state.RuntimeState) -> None:
        params = model.pipeline_params
        group = st.pp_process_group
        self.loss_fn: LossFn | None = None
        self.stages = [
            PipelineStage(stage, stage.stage_index, stage.num_stages, st.device, group=group)
            for stage in model.stage_modules
        ]
        model.refresh_tensors()  # PipelineStage moved the stages to the device: new buffers
        cls = getattr(schedules, f"Schedule{params.pipeline_schedule}")
        single = params.pipeline_schedule in SINGLE_STAGE_SCHEDULES  # one stage, not a list
        stage_arg = self.stages[0] if single else self.stages
        self.schedule = cls(stage_arg, n_microbatches=params.microbatches,
                            loss_fn=self._loss, scale_grads=True)
        self.holds_last = any(stage.is_last for stage in model.stage_modules)
        last_rank = 0 if params.pipeline_schedule == "ZBVZeroBubble" else st.pp_size - 1
        self.last_global_rank = dist.get_global_rank(group, last_rank)
        self.group = group

    def _loss(self, output: Any, target: torch.Tensor) -> torch.Tensor:
        return self.loss_fn(_logits(output), target)


def _pipelined(model: PipelineModule, st: runtime_state.RuntimeState, inputs: torch.Tensor,
               targets: torch.Tensor, loss_fn: LossFn) -> torch.Tensor:
    runner = model.runner
    if runner is None:
        runner = _Runner(model, st)
        object.__setattr__(model, "runner", runner)
    runner.loss_fn = loss_fn
    losses: list[torch.Tensor] = []
    runner.schedule.step(inputs, target=targets, losses=losses, return_outputs=False)
    mean = torch.zeros((), dtype=torch.float32, device=st.device)
    if runner.holds_last:
        mean = torch.stack([loss.detach().float() for loss in losses]).mean()
    dist.broadcast(mean, src=runner.last_global_rank, group=runner.group)
    return mean


__all__ = ["forward_backward"]
