"""The runner's view of a backend during one stage, reporting every task's life to a RunStatus.

Wrapping the backend keeps the runner's own loop as it is: what was submitted, what finished,
what failed and how all pass through `submit`, `result` and `cancel`. Whether a failed attempt
is retried shows when (if) the runner submits the same shard again. A straggler's second attempt
(`submit_again`) is reported as such, and so are which attempt won and a failure of one attempt
while the other ran on.
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
        self._copies: set = set()  # handles of second attempts (zephyr.execution.speculation)
        # read in the runner's inner loop: plain attributes, not __getattr__
        self.max_parallelism = backend.max_parallelism
        self.max_user_retries = backend.max_user_retries
        self.max_infra_retries = backend.max_infra_retries
        self.speculation = getattr(backend, "speculation", None)
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

    def submit_again(self, fn: Callable, shared: Any, task: ShardTask, first: Any) -> Any:
        """A second attempt of the straggler `first` (the runner reports why with `speculated`)."""
        handle = self._backend.submit_again(fn, shared, task, first)
        self._tasks[handle] = task
        self._copies.add(handle)
        return handle

    def speculated(self, task: ShardTask, first: Any, copy: Any, ran: float, threshold: float) -> None:
        placement = getattr(self._backend, "placement", None)
        node = placement(first) if placement is not None else None
        self._status.shard_speculated(self._index, task, ran, threshold, node)

    def result(self, handle: Any) -> Any:
        task = self._tasks.pop(handle)
        copy = handle in self._copies
        self._copies.discard(handle)
        try:
            result = self._backend.result(handle)
        except Exception as e:  # a transient storage error is a lost attempt too, as the runner counts it
            lost = isinstance(e, TaskLost) or getattr(e, "transient", False)
            if any(other.shard == task.shard for other in self._tasks.values()):  # the runner leaves it to the other
                self._status.attempt_set_aside(self._index, task, e, lost=lost, copy=copy)
            else:
                self._status.shard_failed(self._index, task, e, lost=lost)
            raise
        self._status.shard_succeeded(self._index, task, result, copy=copy)
        return result

    def supersede(self, handles: Sequence[Any]) -> None:
        """Cancel the losing attempts of a shard another attempt finished (not counted as cancelled shards)."""
        for handle in handles:
            self._tasks.pop(handle, None)
            self._copies.discard(handle)
        self._backend.cancel(handles)

    def charged_to_user(self, task: ShardTask) -> None:
        """The runner charged the task's failed attempt to the user's retries (one that ran out
        of memory at its ceiling is such a failure, not a memory retry)."""
        self._status.charged_to_user(self._index, task)

    def cancel(self, handles: Sequence[Any]) -> None:
        self._status.tasks_cancelled(self._index, [self._tasks[h] for h in handles if h in self._tasks])
        self._backend.cancel(handles)
