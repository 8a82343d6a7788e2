"""What moves once per optimizer step follows the committed steps of a fault-tolerant job
(``fault.track``): a torch LR scheduler, a torch GradScaler.

A step that did not commit leaves the optimizer as it was (its gradients are dropped), so neither
may move: the scheduler's ``step()`` is skipped after such a step, and the scaler's ``update()``
runs (torch's scaler needs it before its next ``step()``) with its scale and growth count put
back as they were. A healing group receives their state from its peer with the model's and the
optimizer's, so a restarted group goes on at the job's learning rate and loss scale.

The object keeps its class's behaviour and its own state: it becomes an instance of a subclass
that overrides that one method (an attribute set on the instance would land in a scheduler's
``state_dict()``, which is its ``__dict__``, and then in every checkpoint and healing transfer).
"""

from __future__ import annotations

from typing import Any

from meshtrain.contract.errors import ConfigError
from meshtrain_runtime.fault.group_session import FaultSession

# what moves once per step, by the kind of object: (its method, the key of its healed state)
_MOVERS = (("update", "grad_scaler"), ("step", "lr_scheduler"))


def follow(session: FaultSession, follower: Any) -> Any:
    """Make `follower` (an LR scheduler or a GradScaler) follow `session`'s committed steps."""
    if getattr(type(follower), "_meshtrain_followed", False):
        return follower
    mover = _mover(follower)
    if mover is None:
        raise ConfigError(
            "fault.track() follows a torch LR scheduler (step, state_dict, load_state_dict) or "
            f"a torch GradScaler (update, state_dict, load_state_dict); got "
            f"{type(follower).__name__}.")
    name, kind = mover
    key = f"{kind}.{sum(k.startswith(kind + '.') for k in session.state_fns)}"
    session.add_state(key, follower.load_state_dict, follower.state_dict)
    follower.__class__ = _followed_class(type(follower), name, kind, session)
    return follower


def _followed_class(cls: type, name: str, kind: str, session: FaultSession) -> type:
    """`cls` with its `name` method done only after committed steps."""

    def move_if_committed(self: Any, *args: Any, **kwargs: Any) -> Any:
        move = getattr(super(followed, self), name)
        if session.committed:
            return move(*args, **kwargs)
        if kind == "lr_scheduler":
            return None  # the optimizer step did not commit: nothing moved, neither does this
        kept = self.state_dict()
        result = move(*args, **kwargs)  # ends the scaler's step (its per-step bookkeeping)
        self.load_state_dict(kept)
        return result

    followed = type(cls.__name__, (cls,), {name: move_if_committed, "_meshtrain_followed": True,
                                            "__module__": cls.__module__,
                                            "__qualname__": cls.__qualname__})
    return followed


def _mover(follower: Any) -> tuple[str, str] | None:
    if not all(callable(getattr(follower, m, None)) for m in ("state_dict", "load_state_dict")):
        return None
    for name, kind in _MOVERS:
        if callable(getattr(follower, name, None)):
            return name, kind
    return None


__all__ = ["follow"]
