"""One replica group's fault-tolerant training loop, driven by hooks on the script's own objects.

The script needs no change: the transformed model's forward pre-hook starts each step's quorum
(and heals this group from a live peer when torchft says so), FSDP2's all-reduce hook averages the
reduce-scattered gradients across the live groups, and a global optimizer step pre-hook asks the
Manager whether the step commits: when it does not (a peer died during the step), the gradients are
dropped (``grad = None``: torch's optimizers then leave those parameters and their state alone).
"""

from __future__ import annotations

import sys
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.optim.optimizer import register_optimizer_step_pre_hook

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import ReplicaGroupEnv
from meshtrain_runtime.fault.records import RecordWriter, StepRecord, records_path
from meshtrain_runtime.fault.shards import (
    load_model_shards,
    load_optimizer_shards,
    model_shards,
    optimizer_shards,
)

JOIN_POLL_SECONDS = 0.25


class FaultSession:
    """The Manager of this rank's replica group and the state of the step in flight."""

    def __init__(self, settings: ReplicaGroupEnv, manager: Any, process_group: Any, *,
                 group_rank: int, group_world_size: int) -> None:
        self.settings = settings
        self.manager = manager
        self.process_group = process_group
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self.model: nn.Module | None = None
        self.param_ids: set[int] = set()
        self.optimizer: torch.optim.Optimizer | None = None
        self.pending_optimizer: dict[str, Any] | None = None
        self.needs_quorum = True
        self.first_quorum = True
        self.healed = False
        self.rows = 0
        self.losses: list[torch.Tensor] = []
        self.last_participants: list[int] = []
        self.writer = (RecordWriter(records_path(settings.replica_group))
                       if group_rank == 0 else None)

    # --- wiring ---
    def attach_model(self, model: nn.Module) -> None:
        """Hook `model` (transform()'s result) into the quorum, the gradient average and the
        state a healing peer receives."""
        if self.model is not None:
            raise ConfigError("fault tolerance follows one transformed model per process; "
                              "transform() was called twice.")
        units = [m for m in model.modules() if isinstance(m, FSDPModule)]
        if not units:
            raise ConfigError("fault tolerance averages FSDP2's sharded gradients across replica "
                              "groups, but transform() applied no FSDP2 to this model.")
        for unit in units:
            unit.set_all_reduce_hook(self._average_across_groups)
        model.register_forward_pre_hook(self._before_forward, prepend=True, with_kwargs=True)
        self.model = model
        self.param_ids = {id(p) for p in model.parameters()}
        self.manager.register_state_dict_fn("model", self._load_model,
                                            lambda: model_shards(model))
        self.manager.register_state_dict_fn("optimizer", self._load_optimizer,
                                            lambda: optimizer_shards(self.optimizer))
        register_optimizer_step_pre_hook(self._before_optimizer_step)

    # --- hooks ---
    def _before_forward(self, module: nn.Module, args: tuple, kwargs: dict) -> None:
        if not (torch.is_grad_enabled() and module.training):
            return  # evaluation passes are not steps
        if self.needs_quorum:
            self.begin_step()
        self.rows += _rows(args, kwargs)

    def _average_across_groups(self, output: torch.Tensor) -> None:
        self.manager.allreduce(output).wait()

    def _before_optimizer_step(self, optimizer: torch.optim.Optimizer, args: Any,
                               kwargs: Any) -> None:
        params = [p for group in optimizer.param_groups for p in group["params"]]
        if not any(id(p) in self.param_ids for p in params):
            return  # an optimizer of something else
        self._adopt(optimizer)
        if self.needs_quorum:  # a step without a training forward pass
            self.begin_step()
        step = self.manager.current_step()
        loss = self._group_loss()
        committed = self.manager.should_commit()
        if not committed:  # a peer failed mid-step: the averaged gradients are not valid
            for param in params:
                param.grad = None
        self._write(step, committed, loss)
        self.needs_quorum = True

    # --- steps ---
    def begin_step(self) -> None:
        """Start this step's quorum (healing from a peer first when torchft says so)."""
        self.healed, self.rows, self.losses = False, 0, []
        self.manager.start_quorum()
        if self.first_quorum:
            self._await_all_groups()
            self.first_quorum = False
        self.needs_quorum = False

    def step_to_run(self) -> int:
        """Start the coming step's quorum now (healing first if needed); return its number."""
        if self.model is None:
            raise RuntimeError("meshtrain_runtime.fault.step_to_run() needs the transformed "
                               "model: call it after transform().")
        if self.needs_quorum:
            self.begin_step()
        return int(self.manager.current_step())

    def _await_all_groups(self) -> None:
        """At the job's start (step 0) wait for every group, so that all begin together; a
        group that joins a running job (step > 0 after healing) goes on at once. The decision
        is read from the quorum only, so every rank of the group takes the same one."""
        tries = int(self.settings.quorum_timeout_seconds / JOIN_POLL_SECONDS)
        while (self.manager.current_step() == 0 and tries > 0
               and self.manager.num_participants() < self.settings.replica_groups):
            time.sleep(JOIN_POLL_SECONDS)
            self.manager.start_quorum()
            tries -= 1

    def note_loss(self, loss: torch.Tensor) -> None:
        """Remember this step's loss (forward_backward's mean; the mean of several calls)."""
        self.losses.append(loss.detach().float())

    def _group_loss(self) -> float | None:
        if not self.losses:
            return None
        total = torch.stack(self.losses).mean()
        dist.all_reduce(total)  # the group's own world (gloo has no AVG)
        return float(total) / self.group_world_size

    def _write(self, step: int, committed: bool, loss: float | None) -> None:
        if self.writer is None:
            return
        participants = list(self.process_group.participants)
        rows = self.rows * self.group_world_size * len(participants)
        if self.healed or participants != self.last_participants:
            healed = " healed from a peer," if self.healed else ""
            print(f"meshtrain: replica group {self.settings.replica_group} step {step}:{healed} "
                  f"replica groups {participants} take part (committed: {committed})",
                  file=sys.stderr, flush=True)
            self.last_participants = participants
        self.writer.write(StepRecord(
            step=step, replica_group=self.settings.replica_group, participants=participants,
            committed=committed, time=time.time(), healed=self.healed, loss=loss,
            effective_batch=rows if committed and rows else None))

    # --- state a healing peer receives ---
    def _adopt(self, optimizer: torch.optim.Optimizer) -> None:
        if self.optimizer is None:
            self.optimizer = optimizer
        elif optimizer is not self.optimizer:
            raise ConfigError("fault tolerance heals one optimizer per model, but a second "
                              "optimizer steps this model's parameters. Use one optimizer "
                              "(several parameter groups are fine).")
        if self.pending_optimizer is not None:  # healed before the optimizer was seen
            load_optimizer_shards(optimizer, self.pending_optimizer)
            self.pending_optimizer = None

    def _load_model(self, shards: dict[str, torch.Tensor]) -> None:
        assert self.model is not None
        load_model_shards(self.model, shards)
        self.healed = True

    def _load_optimizer(self, shards: dict[str, Any] | None) -> None:
        if shards is None:
            return  # the peer has not stepped yet: a fresh optimizer is the same state
        if self.optimizer is None:
            self.pending_optimizer = shards
        else:
            load_optimizer_shards(self.optimizer, shards)

    def shutdown(self) -> None:
        self.manager.shutdown(wait=False)


def _rows(args: tuple, kwargs: dict) -> int:
    """Rows of the first tensor argument (the batch), 0 when there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0


__all__ = ["FaultSession"]
