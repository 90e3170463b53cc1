"""Which Ray errors mean "the cluster lost this task" (retry it, free) rather than "it failed".

The one classification for Zephyr's Ray backend (a lost shard task becomes `TaskLost`) and for
Marin's TPU runner and executor (`marin.tpu.is_preemption`). Imports Ray only when called.

Lost (the infrastructure, not the task's code or input):

- `NodeDiedError`, `LocalRayletDiedError`: the node went away (a preemption).
- `WorkerCrashedError`: the worker process died. A segfault or the kernel's OOM killer looks
  the same (Ray cannot tell them apart), which is why every retry loop bounds its losses.
- `ObjectLostError` and its kinds (`OwnerDiedError`, `ObjectReconstructionFailedError`,
  `ObjectFetchTimedOutError`, ...): an argument or result lived on a node that died.
- `RayActorError` (`ActorDiedError`, `ActorUnavailableError`): an actor of the run died with
  its node or process.
- `OutOfDiskError`, `ObjectStoreFullError`, `RpcError`: the node's disk or object store filled
  up, or a call between Ray's own processes dropped; another attempt, elsewhere, can succeed.

Not lost (counted against the caller's failure budget, or final):

- `OutOfMemoryError`: Ray's memory monitor killed the task for the memory *it* used. The same
  input would be killed again, so retrying it without bound would never end; it is a failure.
- `TaskCancelledError`: someone cancelled the task on purpose (the runner after a failure or
  an interrupt, an operator); retrying it would undo the cancel.
- `ObjectFreedError` (an `ObjectLostError`): the object was freed on purpose.
- `RaySystemError` (usually an argument that cannot be unpickled on the worker),
  `RuntimeEnvSetupError`, `Task/ActorUnschedulableError`, placement group removed, timeouts:
  retrying the same request cannot help.

Depth: an error counts when it is the error itself (depth 0: a task or actor the caller waited
on died) or the direct cause of a `RayTaskError` (depth 1: a task died while the task the
caller waited on waited for it, or fetching a task's argument failed). Deeper, it was raised
inside the user's own code (its actors or objects were lost), which is the user's failure. A
`RayTaskError` itself is never a loss, although Ray makes it an instance of its cause's class.
"""

from __future__ import annotations

__all__ = ["LOST_ERROR_NAMES", "NOT_LOST_ERROR_NAMES", "OUT_OF_MEMORY_ERROR_NAMES", "is_lost", "lost_cause",
           "lost_error_types", "out_of_memory_cause"]

LOST_ERROR_NAMES = (
    "NodeDiedError",
    "LocalRayletDiedError",
    "WorkerCrashedError",
    "ObjectLostError",
    "RayActorError",
    "OutOfDiskError",
    "ObjectStoreFullError",
    "RpcError",
)
"""`ray.exceptions` classes (and their subclasses) that mean the task was lost."""

NOT_LOST_ERROR_NAMES = ("ObjectFreedError",)
"""Subclasses of a lost class that are not losses (freed on purpose)."""

OUT_OF_MEMORY_ERROR_NAMES = ("OutOfMemoryError",)
"""`ray.exceptions` classes that mean Ray's memory monitor killed the task for its memory: not
lost (the same budget would be killed again), retried by Zephyr's runner with a bigger budget
(`zephyr.out_of_memory`)."""


def lost_error_types() -> tuple[type[BaseException], ...]:
    """The classes named by LOST_ERROR_NAMES."""
    return _classes(LOST_ERROR_NAMES)


def _classes(names: tuple[str, ...]) -> tuple[type[BaseException], ...]:
    import ray.exceptions

    return tuple(getattr(ray.exceptions, name) for name in names)


def lost_cause(error: BaseException, *, max_depth: int = 1) -> BaseException | None:
    """The Ray error that says `error`'s task was lost, or None (see the module docstring)."""
    return _cause_among(error, lost_error_types(), _classes(NOT_LOST_ERROR_NAMES), max_depth)


def out_of_memory_cause(error: BaseException, *, max_depth: int = 1) -> BaseException | None:
    """The Ray error that says `error`'s task was killed for its memory, or None (same depths
    as `lost_cause`)."""
    return _cause_among(error, _classes(OUT_OF_MEMORY_ERROR_NAMES), (), max_depth)


def _cause_among(error: BaseException, kinds: tuple, not_kinds: tuple, max_depth: int) -> BaseException | None:
    from ray.exceptions import RayTaskError

    seen: set[int] = set()
    depth = 0
    while error is not None and depth <= max_depth and id(error) not in seen:
        seen.add(id(error))
        if not isinstance(error, RayTaskError):
            return error if isinstance(error, kinds) and not isinstance(error, not_kinds) else None
        error, depth = getattr(error, "cause", None), depth + 1
    return None


def is_lost(error: BaseException, *, max_depth: int = 1) -> bool:
    """Whether `error` says the cluster lost the task (a preemption), not that it failed."""
    return lost_cause(error, max_depth=max_depth) is not None
