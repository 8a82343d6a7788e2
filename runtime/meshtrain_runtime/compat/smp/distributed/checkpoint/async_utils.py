"""``torch.sagemaker.distributed.checkpoint.async_utils.AsyncCallsQueue``."""

from __future__ import annotations

from concurrent.futures import Future

import torch.distributed as dist


class AsyncCallsQueue:
    """Pending asynchronous saves, finalised in order (SMP / Megatron's queue)."""

    def __init__(self) -> None:
        self._calls: list[tuple[int, Future]] = []
        self._next_index = 0

    def schedule(self, future: Future) -> int:
        """Track `future` (a save in flight); return its call index."""
        index = self._next_index
        self._calls.append((index, future))
        self._next_index += 1
        return index

    def maybe_finalize_async_calls(
        self, blocking: bool = False, process_group: dist.ProcessGroup | None = None
    ) -> list[int]:
        """Finish the saves that are done (all of them when `blocking`); return their indices.

        Every rank of `process_group` must call it: a save counts as finished only when it is
        finished on all of them (a barrier over the group follows the waits).
        """
        done: list[int] = []
        while self._calls:
            index, future = self._calls[0]
            if not blocking and not future.done():
                break
            future.result()  # re-raises a failed save here
            self._calls.pop(0)
            done.append(index)
        if blocking and dist.is_initialized():
            dist.barrier(group=process_group)
        return done

    def get_num_unfinalized_calls(self) -> int:
        return len(self._calls)

    def close(self) -> None:
        self.maybe_finalize_async_calls(blocking=True)


__all__ = ["AsyncCallsQueue"]
