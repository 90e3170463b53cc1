"""Backend registry and the process-wide "flow backend" that pipelines run on.

`create_backend("ray", max_parallelism=200, memory="2GB")` builds one; the `zephyr` command
installs the one chosen on its command line with `set_flow_backend`, and scripts fetch it with
`flow_backend()`. Backends import lazily, so `import zephyr` does not import Ray.
"""

from __future__ import annotations

import importlib
import threading

from zephyr.backends.base import Backend, TaskLost

__all__ = ["Backend", "TaskLost", "backend_names", "create_backend", "flow_backend", "set_flow_backend"]

_REGISTRY = {
    "sync": ("zephyr.backends.sync", "SyncBackend"),
    "threadpool": ("zephyr.backends.threadpool", "ThreadpoolBackend"),
    "ray": ("zephyr.backends.ray", "RayBackend"),
}
DEFAULT_BACKEND = "threadpool"

_lock = threading.Lock()
_current: Backend | None = None


def backend_names() -> list[str]:
    return list(_REGISTRY)


def create_backend(name: str, max_parallelism: int | None = None, **options) -> Backend:
    """A new backend by name ("sync", "threadpool", "ray").

    Options: `memory` ("2GB", "512MiB" or bytes), `num_cpus`, `num_gpus`, `resources`
    (e.g. `{"TPU": 4, "TPU-v4-8-head": 1}`), `max_user_retries`, `max_infra_retries`,
    `retry_backoff` (seconds before the first retry after a transient storage error; doubles),
    `progress` (None: bars only on a terminal), `scratch_dir` (where shuffles spill; must be
    shared storage on a multi-node cluster), `on_shard_failure` ("fail", the default: the
    first shard out of retries ends the run; "quarantine": such shards are set aside, the rest
    of the run goes on, and it ends with `QuarantinedShardsError`), `max_quarantined` (how many
    of a stage's shards quarantine may set aside before the run stops: a count, a fraction of
    the stage's shards, or None; default 0.1), `price_per_core_hour`
    (prices each stage's CPU seconds in the summary, the status page and the run record;
    default `$ZEPHYR_PRICE_PER_CORE_HOUR`), `speculation` (second attempts of straggling shards,
    the first to finish wins: True/False, a dict such as `{"multiplier": 3, "min_seconds": 10,
    "fraction_done": 0.75}` (the defaults), or a `zephyr.execution.speculation.Speculation`;
    default `$ZEPHYR_SPECULATION`, else on; not on sync, which runs one shard at a time).
    Ray also takes `address`.
    """
    if name not in _REGISTRY:
        raise ValueError(f"Unknown backend {name!r}; choose one of {', '.join(_REGISTRY)}")
    module, attr = _REGISTRY[name]
    cls = getattr(importlib.import_module(module), attr)
    return cls(max_parallelism, **options)


def set_flow_backend(backend: Backend | None) -> None:
    """Install the backend that `flow_backend()` returns (None: back to the default)."""
    global _current
    if backend is not None and not isinstance(backend, Backend):
        raise TypeError(f"set_flow_backend expects a Backend, got {type(backend).__name__}")
    with _lock:
        _current = backend


def flow_backend() -> Backend:
    """The configured backend; without one, a threadpool over this machine's cores."""
    global _current
    with _lock:
        if _current is None:
            _current = create_backend(DEFAULT_BACKEND)
        return _current
