"""What the runner needs of a backend (`TaskPool`), and the smallest one: calls run inline.

The runner is written against these protocols, not against `zephyr.backends`: backends sit a
layer above (a `Backend` is a task pool plus `execute`, which builds the runner), so the
runner never imports them. `InlinePool` runs a stage in the driver when nothing but existence
checks is left to do, starting no workers; the sync backend runs its calls the same way.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, Protocol

__all__ = ["ExecutionBackend", "Finished", "InlinePool", "TaskPool", "run_inline"]


class TaskPool(Protocol):
    """Submit picklable calls, wait for some, fetch results (raising `ShardError` or `TaskLost`)."""

    max_parallelism: int
    max_user_retries: int
    max_infra_retries: int
    retry_backoff: float

    def share(self, obj: Any) -> Any: ...
    def submit(self, fn: Callable, shared: Any, arg: Any) -> Any: ...
    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]: ...
    def result(self, handle: Any) -> Any: ...
    def cancel(self, handles: Sequence[Any]) -> None: ...
    def drain(self, handles: Sequence[Any], timeout: float = 120.0) -> None: ...
    # a pool whose `speculation` policy (zephyr.execution.speculation) is enabled also has
    # `submit_again(fn, shared, arg, first)` and `running_since(handles)` (Backend's docstrings)


class ExecutionBackend(TaskPool, Protocol):
    """A task pool with what a whole run asks of it: task sizes, scratch, a name, callbacks."""

    requires_pickling: bool
    progress: bool | None
    scratch_dir: str | None
    task_resources: Any  # zephyr.resources.TaskResources
    on_finish: list[Callable]

    def spans_machines(self) -> bool: ...
    def describe(self) -> str: ...


class Finished:
    """The outcome of a call that already ran: its value or its exception."""

    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value = value
        self.error = error

    def get(self) -> Any:
        if self.error is not None:
            raise self.error
        return self.value


def run_inline(fn: Callable, shared: Any, arg: Any) -> Finished:
    """Run `fn(shared, arg)` now, in this thread; its failure is kept for `result()`."""
    try:
        return Finished(value=fn(shared, arg))
    except Exception as e:
        return Finished(error=e)


class InlinePool:
    """One call at a time, in the caller's thread, no retries."""

    max_parallelism = 1
    max_user_retries = 0
    max_infra_retries = 0
    retry_backoff = 0.0

    def share(self, obj: Any) -> Any:
        return obj

    def submit(self, fn: Callable, shared: Any, arg: Any) -> Finished:
        return run_inline(fn, shared, arg)

    def wait(self, handles: Sequence[Finished], timeout: float | None = None) -> list[Finished]:
        return list(handles)

    def result(self, handle: Finished) -> Any:
        return handle.get()

    def cancel(self, handles: Sequence[Any]) -> None:
        pass

    def drain(self, handles: Sequence[Any], timeout: float = 120.0) -> None:
        pass
