"""The runner's view of a backend during one stage, reporting every task's life to a RunStatus.

Wrapping the backend keeps the runner's own loop as it is: what was submitted, what finished,
what failed and how all pass through `submit`, `result` and `cancel`. Whether a failed attempt
is retried shows when (if) the runner submits the same shard again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

from zephyr.errors import TaskLost

if TYPE_CHECKING:
    from zephyr.execution.pool import TaskPool
    from zephyr.tasks import ShardResult, ShardTask
    from zephyr.status.model import RunStatus

__all__ = ["ObservedBackend"]


class ObservedBackend:
    """Delegates to `backend`; tells `status` about each task of stage `index`."""

    def __init__(self, backend: TaskPool, status: RunStatus, index: int, resumed: Sequence[ShardResult] = (),
                 num_shards: int | None = None):
        self._backend = backend
        self._status = status
        self._index = index
        self._tasks: dict[Any, ShardTask] = {}
        # read in the runner's inner loop: plain attributes, not __getattr__
        self.max_parallelism = backend.max_parallelism
        self.max_user_retries = backend.max_user_retries
        self.max_infra_retries = backend.max_infra_retries
        status.stage_started(index, list(resumed), num_shards)
        status.watch_starts(index, self.started_shards)

    def started_shards(self) -> set[int] | None:
        """The shards in flight whose task has begun running (the backend's `started`; a pool
        without one starts its calls at once); None when the backend cannot tell. Called by a
        snapshot, from any thread."""
        in_flight = list(self._tasks.items())  # a C-level copy: the runner adds and removes meanwhile
        started = getattr(self._backend, "started", None)
        handles = started([h for h, _ in in_flight]) if started is not None else {h for h, _ in in_flight}
        return None if handles is None else {task.shard for h, task in in_flight if h in handles}

    def __getattr__(self, name: str) -> Any:
        return getattr(self._backend, name)

    def submit(self, fn: Callable, shared: Any, task: ShardTask) -> Any:
        handle = self._backend.submit(fn, shared, task)
        self._tasks[handle] = task
        self._status.shard_submitted(self._index, task)
        return handle

    def result(self, handle: Any) -> Any:
        task = self._tasks.pop(handle)
        try:
            result = self._backend.result(handle)
        except TaskLost as e:
            self._status.shard_failed(self._index, task, e, lost=True)
            raise
        except Exception as e:  # a transient storage error is a lost attempt too, as the runner counts it
            self._status.shard_failed(self._index, task, e, lost=getattr(e, "transient", False))
            raise
        self._status.shard_succeeded(self._index, task, result)
        return result

    def charged_to_user(self, task: ShardTask) -> None:
        """The runner charged the task's failed attempt to the user's retries (one that ran out
        of memory at its ceiling is such a failure, not a memory retry)."""
        self._status.charged_to_user(self._index, task)

    def cancel(self, handles: Sequence[Any]) -> None:
        self._status.tasks_cancelled(self._index, [self._tasks[h] for h in handles if h in self._tasks])
        self._backend.cancel(handles)
