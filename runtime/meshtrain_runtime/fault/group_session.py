"""One replica group's fault-tolerant training loop, driven by hooks on the script's own objects.

The script needs no change: the transformed model's forward pre-hook starts each step's quorum
(and heals this group from a live peer when torchft says so), FSDP2's all-reduce hook averages the
reduce-scattered gradients across the live groups, and a global optimizer step pre-hook asks the
Manager whether the step commits: when it does not (a peer died during the step), the gradients are
dropped (``grad = None``: torch's optimizers then leave those parameters and their state alone).

The group joins the job only when it can step: its torchft Manager (the lighthouse heartbeats,
the quorum) starts at the group's first training step, after its imports, ``init()``,
``transform()`` and the optimizer exist, so a restarted group never holds the live groups in a
quorum while it is still starting.
"""

from __future__ import annotations

import time
import warnings
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.fsdp import FSDPModule
from torch.optim.optimizer import register_optimizer_step_pre_hook

from meshtrain.contract.errors import ConfigError
from meshtrain.contract.fault_tolerance import ReplicaGroupEnv
from meshtrain_runtime.fault import coordination
from meshtrain_runtime.fault.records import RecordWriter, StepRecord, records_path
from meshtrain_runtime.fault.shards import (
    load_model_shards,
    load_optimizer_shards,
    model_shards,
    optimizer_shards,
)
from meshtrain_runtime.fault.torchft_parts import build_manager

JOIN_POLL_SECONDS = 0.25
StateFns = tuple[Any, Any]  # (load_state_dict, state_dict) a healing peer's state goes through


class FaultSession:
    """The Manager of this rank's replica group and the state of the step in flight."""

    def __init__(self, settings: ReplicaGroupEnv, *, group_rank: int, group_world_size: int,
                 device_type: str) -> None:
        self.settings = settings
        self.group_rank = group_rank
        self.group_world_size = group_world_size
        self.device_type = device_type
        self.manager: Any = None  # torchft's Manager, from the group's first step on
        self.process_group: Any = None
        self.state_fns: dict[str, StateFns] = {}
        self.resumed: dict[str, int] = {"step": 0, "batches_committed": 0}
        self.model: nn.Module | None = None
        self.param_ids: set[int] = set()
        self.optimizer: torch.optim.Optimizer | None = None
        self.pending_optimizer: dict[str, Any] | None = None
        self.needs_quorum = True
        self.first_quorum = True
        self.healed = False
        self.began = self.quorum_seconds = 0.0
        self.committed = True  # the last step's decision (a tracked scheduler follows it)
        self.superseded = False
        self.outside_training = 0  # > 0: optimizer steps are not training steps (checkpoints)
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
        self.add_state("model", self._load_model, lambda: model_shards(model))
        self.add_state("optimizer", self._load_optimizer,
                       lambda: optimizer_shards(self.optimizer))
        register_optimizer_step_pre_hook(self._before_optimizer_step)

    def add_state(self, key: str, load: Any, save: Any) -> None:
        """State a healing group receives from its peer under `key`."""
        if key in self.state_fns:
            raise ConfigError(f"fault tolerance: {key!r} is already followed.")
        self.state_fns[key] = (load, save)
        if self.manager is not None:
            self.manager.register_state_dict_fn(key, load, save)

    def _start_manager(self) -> None:
        """Join the job: torchft's Manager for this group (heartbeats start here)."""
        self.manager, self.process_group = build_manager(
            self.settings, group_rank=self.group_rank, group_world_size=self.group_world_size,
            device_type=self.device_type)
        for key, (load, save) in self.state_fns.items():
            self.manager.register_state_dict_fn(key, load, save)
        # torchft's transport hands torch a read-only buffer of the peer's state, which torch
        # copies; its warning (2 lines per rank and heal) says nothing to the user
        warnings.filterwarnings("ignore", message="The given buffer is not writable",
                                category=UserWarning)
        if self.resumed["step"]:
            self.manager.load_state_dict(dict(self.resumed))

    def resume(self, record: dict[str, int]) -> None:
        """A checkpoint was loaded: the committed steps it was saved at become this group's."""
        self.resumed = {"step": int(record.get("step", 0)),
                        "batches_committed": int(record.get("batches_committed", 0))}
        if self.manager is not None:
            self.manager.load_state_dict(dict(self.resumed))

    def current_step(self) -> int:
        """Steps committed so far (before the first step: 0, or a loaded checkpoint's)."""
        return (self.resumed["step"] if self.manager is None
                else int(self.manager.current_step()))

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
        if self.outside_training or not any(id(p) in self.param_ids for p in params):
            return  # an optimizer of something else, or torch creating a loaded one's state
        self._adopt(optimizer)
        if self.needs_quorum:  # a step without a training forward pass
            self.begin_step()
        step = self.manager.current_step()
        loss = self._group_loss()
        self._stop_if_the_job_finished()  # never commit a step alone after another finished
        self.committed = bool(self.manager.should_commit())
        if not self.committed:  # a peer failed mid-step: the averaged gradients are not valid
            for param in params:
                param.grad = None
        self._write(step, self.committed, loss)
        self.needs_quorum = True

    # --- steps ---
    def begin_step(self) -> None:
        """Start this step's quorum (healing from a peer first when torchft says so)."""
        self.healed, self.rows, self.losses = False, 0, []
        self.began = time.time()
        if self.manager is None:
            self._start_manager()
        self.manager.start_quorum()
        if self.first_quorum:
            self._await_all_groups()
            self.first_quorum = False
        self.quorum_seconds = time.time() - self.began
        self._stop_if_the_job_finished()
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
        """At this group's first quorum, when no live group is ahead of it (the job's start, or
        every group resuming from a checkpoint), wait for every group, so that all begin
        together; a group that heals from a peer ahead of it goes on at once. The decision is
        read from the quorum only, so every rank of the group takes the same one."""
        start = self.resumed["step"]
        tries = int(self.settings.quorum_timeout_seconds / JOIN_POLL_SECONDS)
        while (self.manager.current_step() == start and tries > 0
               and self.manager.num_participants() < self.settings.replica_groups):
            self._stop_if_the_job_finished()  # a group that finished never comes
            time.sleep(JOIN_POLL_SECONDS)
            self.manager.start_quorum()
            tries -= 1

    def _stop_if_the_job_finished(self) -> None:
        """In a quorum without every group, stop this group if another finished the job (its
        marker). The ranks of the group agree first (a collective of the group's own world)."""
        if self.manager.num_participants() >= self.settings.replica_groups:
            return
        folder, own = self.settings.coordination_dir, self.settings.replica_group
        if not self._group_any(bool(coordination.finished_groups(folder, own))):
            return
        self.superseded = True
        finished = coordination.finished_groups(folder, own)
        line = None
        if self.group_rank == 0:
            line = coordination.mark_superseded(folder, own, finished, self.current_step())
            coordination.say(line)
        raise coordination.ReplicaGroupSuperseded(line or "another replica group finished")

    def _group_any(self, flag: bool) -> bool:
        """True on every rank of this group when it is True on one (MAX over the group)."""
        device = (torch.device("cuda", torch.cuda.current_device())
                  if self.device_type == "cuda" else torch.device("cpu"))
        value = torch.tensor([1 if flag else 0], dtype=torch.int32, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.MAX)
        return bool(value.item())

    def finish(self) -> None:
        """The script returned: say this group finished the job (before the Manager stops
        heartbeating, so no other group steps alone without seeing it)."""
        if self.superseded or self.manager is None or self.group_rank != 0:
            return
        coordination.mark_finished(self.settings.coordination_dir,
                                   self.settings.replica_group, self.current_step())

    def writes_checkpoint(self) -> bool:
        """Whether this group writes the current step's checkpoint (the lowest of its quorum)."""
        participants = list(self.process_group.participants) if self.process_group else []
        return coordination.checkpoint_writer(participants) == self.settings.replica_group

    def checkpoint_record(self) -> dict[str, int]:
        """What a checkpoint keeps to resume the job's step count."""
        state = (dict(self.resumed) if self.manager is None else self.manager.state_dict())
        return {"step": int(state["step"]), "batches_committed": int(state["batches_committed"])}

    def note_checkpoint(self, kind: str, seconds: float, step: int | None) -> None:
        """A checkpoint this group saved or loaded took `seconds` (its rank 0 keeps a line)."""
        if self.group_rank == 0:
            RecordWriter(records_path(self.settings.replica_group, kind="checkpoints")).write(
                {"kind": kind, "seconds": round(seconds, 4), "step": step, "time": time.time(),
                 "replica_group": self.settings.replica_group})

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
            coordination.say(f"meshtrain: replica group {self.settings.replica_group} step "
                             f"{step}:{healed} replica groups {participants} take part "
                             f"(committed: {committed})")
            self.last_participants = participants
        self.writer.write(StepRecord(
            step=step, replica_group=self.settings.replica_group, participants=participants,
            committed=committed, began=self.began, quorum_seconds=round(self.quorum_seconds, 4),
            time=time.time(), healed=self.healed, loss=loss,
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
        if self.manager is not None:
            self.manager.shutdown(wait=False)


def _rows(args: tuple, kwargs: dict) -> int:
    """Rows of the first tensor argument (the batch), 0 when there is none."""
    for value in (*args, *kwargs.values()):
        if isinstance(value, torch.Tensor) and value.dim() > 0:
            return int(value.shape[0])
    return 0


__all__ = ["FaultSession"]
