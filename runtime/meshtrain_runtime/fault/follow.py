"""A torch LR scheduler that follows the committed steps of a fault-tolerant job (``fault.track``).

A step that did not commit leaves the optimizer as it was (its gradients are dropped), so the
scheduler must not move either: its ``step()`` is skipped after such a step. A healing group
receives the scheduler's state from its peer with the model's and the optimizer's, so a restarted
group goes on at the job's learning rate, not its own loop's first one.
"""

from __future__ import annotations

from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.fault.session import FaultSession


def follow_scheduler(session: FaultSession, scheduler: Any) -> Any:
    """Make `scheduler` follow `session`'s committed steps; returns it."""
    if not (callable(getattr(scheduler, "step", None))
            and callable(getattr(scheduler, "state_dict", None))
            and callable(getattr(scheduler, "load_state_dict", None))):
        raise ConfigError(
            f"fault.track() follows a torch LR scheduler (step, state_dict, load_state_dict); "
            f"got {type(scheduler).__name__}.")
    if getattr(scheduler, "_meshtrain_followed", False):
        return scheduler
    step = scheduler.step

    def step_if_committed(*args: Any, **kwargs: Any) -> Any:
        if session.committed:
            return step(*args, **kwargs)
        return None  # the optimizer step did not commit: nothing moved, neither does this

    key = f"lr_scheduler.{sum(k.startswith('lr_scheduler.') for k in session.state_fns)}"
    session.add_state(key, scheduler.load_state_dict, scheduler.state_dict)
    scheduler.step = step_if_committed
    scheduler._meshtrain_followed = True
    return scheduler


__all__ = ["follow_scheduler"]
