"""Shared read-only objects: ship a model or a bloom filter to every task once, by name.

    backend = zephyr.create_backend("ray")
    backend.put("blocklist", load_bloom_filter())          # driver: once
    ...
    def keep(doc):
        return doc["url"] not in zephyr.get_shared("blocklist")   # any task of any later run

On Ray, `put` stores the object in Ray's object store once (`ray.put`); each task carries
only the reference, and each worker process fetches (and deserializes) it once, on the first
`get_shared`. On the sync and threadpool backends `put` keeps a plain reference: every task
sees the very same object, so it must not be mutated. Capturing a large object in a
function's closure instead ships a copy of it with every stage's program.

The backend hands its registry (name -> object or reference) to each task it runs; the task
installs it for its thread while it runs, which is where `get_shared` looks.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

__all__ = ["RemoteObject", "call_with_shared", "get_shared", "installed"]

_local = threading.local()
_fetched: dict[str, Any] = {}  # per process: Ray object id -> the fetched object
_fetch_lock = threading.Lock()


@dataclass(frozen=True)
class RemoteObject:
    """A `put` object that lives in Ray's object store."""

    ref: Any  # a ray.ObjectRef

    def fetch(self) -> Any:
        key = self.ref.hex()
        with _fetch_lock:
            if key not in _fetched:
                import ray

                _fetched[key] = ray.get(self.ref)
            return _fetched[key]


def get_shared(name: str) -> Any:
    """The object `backend.put(name, obj)` shared, from inside a task of that backend.

    Raises:
        LookupError: outside a running task, or no object was put under `name` (lists the
            names that were).
    """
    registry: Mapping[str, Any] | None = getattr(_local, "registry", None)
    if registry is None:
        raise LookupError(
            f"get_shared({name!r}) works inside the tasks of a pipeline (in their own thread); "
            "call it from a map/filter/map_shard function, after backend.put(name, obj) in the driver"
        )
    if name not in registry:
        known = ", ".join(repr(k) for k in sorted(registry)) or "none"
        raise LookupError(f"no shared object named {name!r}; the backend has: {known} (share one with backend.put({name!r}, obj))")
    value = registry[name]
    return value.fetch() if isinstance(value, RemoteObject) else value


@contextmanager
def installed(registry: Mapping[str, Any]):
    """Make `registry` what `get_shared` reads in this thread while the block runs."""
    _forget_unlisted(registry)
    previous = getattr(_local, "registry", None)
    _local.registry = registry
    try:
        yield
    finally:
        _local.registry = previous


def call_with_shared(registry: Mapping[str, Any], fn: Callable, *args: Any) -> Any:
    """`fn(*args)` with `registry` installed: what a backend submits for each task."""
    with installed(registry):
        return fn(*args)


def _forget_unlisted(registry: Mapping[str, Any]) -> None:
    """Drop fetched objects that the current registry no longer lists (a reused Ray worker
    must not hold on to the models of earlier pipelines)."""
    keep = {value.ref.hex() for value in registry.values() if isinstance(value, RemoteObject)}
    with _fetch_lock:
        for key in [k for k in _fetched if k not in keep]:
            del _fetched[key]
