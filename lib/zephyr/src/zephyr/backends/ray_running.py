"""Which of the Ray backend's tasks are running now, as opposed to waiting in Ray's queue for a CPU.

The runner keeps up to `max_parallelism` tasks in flight (200 by default), far more than a small
cluster has CPUs: Ray holds the rest until a CPU frees. To tell them apart, each task marks
itself in Ray's GCS key-value store while its function runs (a key under the backend's prefix,
put as it starts, deleted as it ends, whatever the outcome); the driver lists the marks with one
request when someone asks (a status snapshot). A task that could not mark itself shows as
waiting (its worker logs a warning); a task whose worker was killed mid-run leaves its mark
until the backend closes, which is harmless: only calls still in flight are looked up.

A mark's value says where and since when the task runs (`<node id> <epoch seconds>`): the runner
reads it for the few attempts it suspects of straggling, to time them from their start and to
start their second attempt on another node (`zephyr.execution.speculation`).
"""

from __future__ import annotations

import itertools
import logging
import time
import uuid
from collections.abc import Callable, Sequence
from typing import Any

__all__ = ["NAMESPACE", "RunningMarks", "call_marked"]

NAMESPACE = "zephyr-running"

logger = logging.getLogger("zephyr")


def call_marked(fn: Callable, shared: Any, arg: Any, key: str | None = None) -> Any:
    """`fn(shared, arg)` in a Ray worker, with `key` marked in the GCS store while it runs."""
    if key is None:
        return fn(shared, arg)
    import ray
    from ray.experimental import internal_kv

    try:
        where = f"{ray.get_runtime_context().get_node_id()} {time.time():.3f}"
        internal_kv._internal_kv_put(key, where.encode(), namespace=NAMESPACE)
    except Exception as e:  # noqa: BLE001 - a status aid: the task runs regardless
        logger.warning("zephyr: could not mark task %s as running (the status page shows it waiting): %s", key, e)
    try:
        return fn(shared, arg)
    finally:
        try:
            internal_kv._internal_kv_del(key, namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 - the driver removes every mark when the backend closes
            pass


class RunningMarks:
    """The driver's side: a key per submitted call, and which calls have their mark now."""

    def __init__(self):
        self.prefix = f"{uuid.uuid4().hex}/"
        self._ids = itertools.count()
        self._keys: dict[Any, str] = {}  # handle -> its call's key, while in flight
        self._where: dict[Any, tuple[str, float]] = {}  # handle -> (node id, started epoch s), once read

    def new_key(self) -> str:
        return f"{self.prefix}{next(self._ids)}"

    def remember(self, handle: Any, key: str) -> None:
        self._keys[handle] = key

    @property
    def in_flight(self) -> int:
        """How many calls are in flight now."""
        return len(self._keys)

    def forget(self, handle: Any) -> None:
        self._keys.pop(handle, None)
        self._where.pop(handle, None)

    def started(self, handles: Sequence[Any]) -> set | None:
        """The handles whose task has begun running; None when the store cannot be asked."""
        from ray.experimental import internal_kv

        try:
            marked = set(internal_kv._internal_kv_list(self.prefix, namespace=NAMESPACE))
        except Exception as e:  # noqa: BLE001 - the snapshot says it cannot tell
            logger.debug("zephyr: cannot list running tasks: %s", e)
            return None
        return {h for h in handles if (key := self._keys.get(h)) is not None and key.encode() in marked}

    def since(self, handles: Sequence[Any]) -> dict[Any, float] | None:
        """When each of `handles` that runs now began (epoch seconds): one listing, then one read
        per running call not read before; None when the store cannot be asked."""
        running = self.started([h for h in handles if h not in self._where])
        if running is None:
            return None
        for handle in running:
            self._read(handle)
        return {h: self._where[h][1] for h in handles if h in self._where}

    def node(self, handle: Any) -> str | None:
        """The id of the node the call runs on, if it has started (and marked itself)."""
        if handle not in self._where:
            self._read(handle)
        return self._where[handle][0] if handle in self._where else None

    def _read(self, handle: Any) -> None:
        from ray.experimental import internal_kv

        key = self._keys.get(handle)
        try:
            value = internal_kv._internal_kv_get(key, namespace=NAMESPACE) if key is not None else None
            node, started = value.decode().split()
            self._where[handle] = (node, float(started))
        except Exception as e:  # noqa: BLE001 - not started, or an old-style mark: timed from submission
            logger.debug("zephyr: cannot read where task %s runs: %s", key, e)

    def clear(self) -> None:
        """Remove every mark of this backend (those of killed workers included)."""
        from ray.experimental import internal_kv

        self._keys.clear()
        self._where.clear()
        try:
            internal_kv._internal_kv_del(self.prefix, del_by_prefix=True, namespace=NAMESPACE)
        except Exception:  # noqa: BLE001 - Ray already gone: nothing left to clean
            pass
