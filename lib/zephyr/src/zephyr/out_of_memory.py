"""A task killed for memory: not the user's error while it can be given more.

Two signs reach the runner: a backend that saw the task killed for its memory raises
`TaskOutOfMemory` (Ray's memory monitor: `ray.exceptions.OutOfMemoryError`, see
`zephyr.backends.ray_errors`), and a task that ran out itself fails with a `ShardError`
whose error type is `MemoryError` (an allocation refused) or `OutOfMemoryError`. The runner
(`zephyr.execution.stage_loop`) retries such a task with twice its memory budget, up to the
ceiling (`zephyr.execution.memory`); at the ceiling it is a failure like any other. A worker
the kernel's OOM killer ended looks like any crashed worker to Ray (`WorkerCrashedError`):
that stays a lost task.
"""

from __future__ import annotations

__all__ = ["MEMORY_ERROR_TYPES", "TaskOutOfMemory", "is_out_of_memory"]

MEMORY_ERROR_TYPES = ("MemoryError", "OutOfMemoryError")
"""Error type names (a `ShardError`'s `error_type`, or an exception's class) meaning "ran out of memory"."""


class TaskOutOfMemory(Exception):
    """The backend killed the task for the memory it used (raised by `TaskPool.result`)."""


def is_out_of_memory(error: BaseException) -> bool:
    """Whether `error` says its task ran out of memory (see the module docstring)."""
    if isinstance(error, (TaskOutOfMemory, MemoryError)):
        return True
    return getattr(error, "error_type", None) in MEMORY_ERROR_TYPES or type(error).__name__ in MEMORY_ERROR_TYPES
