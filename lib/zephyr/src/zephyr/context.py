"""The reference project's entry point, `ZephyrContext`, over our one runner and backends.

    ctx = ZephyrContext(max_workers=8, resources=ResourceConfig(cpu=1, ram="2g"))
    ctx.put("blocklist", words)                      # zephyr_worker_ctx().get_shared("blocklist")
    outcome = ctx.execute(pipeline)                  # ZephyrExecutionResult(results, counters)

A context runs pipelines on a backend, its "pool": `client` is a Backend (`create_backend(...)`),
a backend name ("sync", "threadpool", "ray"), or None for `flow_backend()`. `with ctx:` keeps one
pool for every execute inside (a named backend is created on entry and closed on exit); a
plain execute on a named backend creates and closes its own. Each execute runs through a
per-run view of the pool (`_RunView`): its own shared objects (`put` is per thread, as in
the reference), its task resources and parallelism, so concurrent executes never mix.
`pool.execution_scope()` makes every context executed in this thread (e.g. in a child task of
a fan-out) run on that pool, checking that its resources fit one of the pool's workers.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import logging
import math
import os
import re
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

from zephyr.backends import create_backend, flow_backend
from zephyr.backends.base import Backend
from zephyr.backends.shared import installed
from zephyr.errors import PlanError, ShardError
from zephyr.resources import parse_memory
from zephyr.backends import shared
from zephyr.backends.shared import get_shared
from zephyr.errors import NotConvergedError
from zephyr.execution.quarantine import QuarantinedShardsError, QuarantineLimitError
from zephyr.execution.run_lock import OutputBusyError
from zephyr.execution.speculation import speculation_option
from zephyr.execution.runner import Execution

__all__ = [
    "IntraShardExecution",
    "ResourceConfig",
    "WorkerContext",
    "ZephyrContext",
    "ZephyrExecutionResult",
    "ZephyrWorkerError",
    "zephyr_worker_ctx",
]

logger = logging.getLogger("zephyr")

MAX_SHARD_FAILURES = 3
MAX_SHARD_INFRA_FAILURES = 20
MAX_CONCURRENT_PIPELINES = 16


@dataclass(frozen=True)
class ResourceConfig:
    """What one worker (or one task) needs: the fields of the reference's resource config.

    Only `cpu`, `ram` and `device` ("gpu" counts, or a dict of custom Ray resources) reach a
    backend; the placement fields must match the pool's, as in the reference.
    """

    cpu: float = 1
    ram: str | int = "1g"
    disk: str | int = "16g"
    device: Any = None
    preemptible: bool = True
    regions: Any = None
    zone: str | None = None
    image: str | None = None
    replicas: int = 1


_PLACEMENT = ("device", "preemptible", "regions", "zone", "image", "replicas")
_UNIT = re.compile(r"\s*([0-9.]+)\s*([kmgtp])(i?b?)\s*", re.IGNORECASE)


def ram_bytes(value: str | int | None) -> int:
    """Bytes of a size as the reference reads it: "512m", "1g" and "1GiB" are binary units."""
    if value is None or value == 0:
        return 0
    if isinstance(value, str) and (match := _UNIT.fullmatch(value)):
        value = f"{match.group(1)}{match.group(2)}i"
    return parse_memory(value) or 0


@dataclass(frozen=True)
class ZephyrExecutionResult:
    """What `ZephyrContext.execute` returns: the last stage's items (for writes, the output
    paths) in shard order, and the run's counters (built-in `zephyr/...` ones and the user's)."""

    results: list
    counters: dict


class ZephyrWorkerError(ShardError):
    """A user function or bad input failed a shard (a `ShardError`: stage, shard, source and
    the original traceback); never retried by `max_execution_retries`."""

    @classmethod
    def of(cls, error: ShardError) -> ZephyrWorkerError:
        return cls(error.stage, error.shard, error.source, error.error_type, error.error_message, error.traceback_text,
                   error.transient, error.record)

    def __reduce__(self):
        return (type(self), super().__reduce__()[1])


class IntraShardExecution(enum.StrEnum):
    """Whether a stage with fewer shards than workers splits each shard's per-item ops over the
    idle workers' share of processes (AUTO), keeping the shard's output and order; OFF runs each
    shard as one task. See `zephyr.execution.intra_shard`."""

    OFF = "off"
    AUTO = "auto"


# deterministic failures: another attempt would fail the same way
# the run's own verdicts (a user error, a busy output, quarantined shards, a component search
# that did not converge) end it; a run attempt is retried only for what else goes wrong
_NON_RETRYABLE = (ShardError, PlanError, ValueError, TypeError, KeyError, AttributeError, MemoryError, LookupError,
                  OutputBusyError, QuarantinedShardsError, QuarantineLimitError, NotConvergedError)


# ---- inside a task ---------------------------------------------------------------------------

@dataclass(frozen=True)
class _TaskInfo:
    registry: dict
    memory: int | None
    name: str


_task = threading.local()


def _in_worker(info: _TaskInfo, fn: Callable, *args: Any) -> Any:
    """Run one task with its run's shared objects and description installed."""
    previous = getattr(_task, "info", None)
    _task.info = info
    try:
        with installed(info.registry):
            return fn(*args)
    finally:
        _task.info = previous


class WorkerContext:
    """What a task sees of its run: `get_shared(name)`, `task_memory_bytes`."""

    def __init__(self, info: _TaskInfo | None):
        self._info = info

    def get_shared(self, name: str) -> Any:
        """The object the driver `put` under `name` (LookupError naming the ones that exist)."""
        return get_shared(name)

    @property
    def task_memory_bytes(self) -> int | None:
        """The memory budget of this task in bytes (its run's map task resources), if set."""
        return self._info.memory if self._info is not None else None

    @property
    def context_name(self) -> str | None:
        return self._info.name if self._info is not None else None


def zephyr_worker_ctx() -> WorkerContext:
    """The running task's context; RuntimeError outside a task of a pipeline."""
    info = getattr(_task, "info", None)
    if info is None and getattr(shared._local, "registry", None) is None:
        raise RuntimeError("zephyr_worker_ctx() is only available inside a task of a running Zephyr pipeline")
    return WorkerContext(info)


# ---- the per-run view of a pool -------------------------------------------------------------

class _RunView(Backend):
    """One execute's view of a pool backend: its shared objects, resources and parallelism;
    submits, waits and results go to the pool."""

    def __init__(self, pool: Backend, parallelism: int, task: ResourceConfig, shared: dict, scratch_dir: str | None,
                 user_retries: int | None, infra_retries: int | None, name: str, intra_shard: bool = False,
                 speculation: Any = None):
        self.inline = pool.inline  # before the base class reads it (no second attempts on an inline pool)
        super().__init__(
            parallelism,
            memory=ram_bytes(task.ram) or None,
            num_cpus=float(task.cpu),
            num_gpus=pool.task_resources.num_gpus,
            resources=pool.task_resources.resources,
            max_user_retries=pool.max_user_retries if user_retries is None else user_retries,
            max_infra_retries=pool.max_infra_retries if infra_retries is None else infra_retries,
            retry_backoff=pool.retry_backoff,
            progress=pool.progress,
            scratch_dir=scratch_dir or pool.scratch_dir,
            # what the pool was told to do with failing shards and how to price them (e.g. by
            # `zephyr --on-shard-failure=quarantine`) holds for every run on it
            on_shard_failure=pool.on_shard_failure,
            max_quarantined=pool.max_quarantined,
            price_per_core_hour=pool.price_per_core_hour,
            speculation=pool.speculation if speculation is None else speculation,
        )
        self.name = pool.name
        self.requires_pickling = pool.requires_pickling
        self.on_finish = pool.on_finish
        self._pool = pool
        self._context_name = name
        # split shards run their per-item ops in fresh processes, which the run's shared objects
        # do not reach: a run with shared objects keeps each shard in its task
        self.intra_shard_workers = parallelism if intra_shard and not shared else 0
        for key, obj in shared.items():
            self.put(key, obj)

    def _store(self, name: str, obj: Any) -> Any:
        return self._pool._store(name, obj)

    def bound(self, fn: Callable) -> Callable:
        info = _TaskInfo(dict(self._shared), self.task_resources.memory, self._context_name)
        return functools.partial(_in_worker, info, fn)

    def share(self, obj: Any) -> Any:
        return self._pool.share(obj)

    def submit(self, fn: Callable, shared: Any, arg: Any) -> Any:
        return self._pool.submit(self.bound(fn), shared, arg)

    def wait(self, handles, timeout=None):
        return self._pool.wait(handles, timeout)

    def result(self, handle: Any) -> Any:
        return self._pool.result(handle)

    def submit_again(self, fn: Callable, shared: Any, arg: Any, first: Any) -> Any:
        return self._pool.submit_again(self.bound(fn), shared, arg, first)

    def running_since(self, handles) -> dict | None:
        return self._pool.running_since(handles)

    def placement(self, handle: Any) -> str | None:
        return self._pool.placement(handle)

    def cancel(self, handles) -> None:
        self._pool.cancel(handles)

    def spans_machines(self) -> bool:
        return self._pool.spans_machines()

    def memory_ceiling(self) -> int:
        """The pool's: on Ray, a share of the smallest node's memory resource (this process's
        machine, which the base class would use, may hold more than any node: a task sized past
        every node's memory could never be scheduled)."""
        return self._pool.memory_ceiling()

    def close(self) -> None:
        self._shared.clear()  # the pool stays: it is the context's (or the caller's)


# ---- the context ----------------------------------------------------------------------------

class _State(enum.StrEnum):
    NEW = "new"
    OWNER = "owner"
    BORROWED = "borrowed"
    CLOSED = "closed"


@dataclass(frozen=True)
class _Scope:
    pool: Backend
    worker: ResourceConfig
    max_workers: int


_POOLS: dict[str, Backend] = {}  # this process's entered pools, for contexts unpickled here
_scope: ContextVar[_Scope | None] = ContextVar("zephyr_execution_scope", default=None)


@dataclass
class ZephyrContext:
    """Runs pipelines: `execute(dataset)` -> `ZephyrExecutionResult(results, counters)`.

    Args:
        client: the pool: a Backend, a backend name ("sync", "threadpool", "ray"), or None
            for `flow_backend()`.
        max_workers: workers of the pool (the run's parallelism, times the tasks that fit one
            worker); None: `ZEPHYR_MAX_WORKERS`, else the backend's max_parallelism.
        resources: one worker's `ResourceConfig` (cpu, ram); a backend this context creates
            reserves it per task.
        coordinator_resources, no_workers_timeout, heartbeat_timeout,
            max_concurrent_pipelines: accepted for compatibility; our runner has no
            coordinator actor or worker heartbeat (the backend reports lost tasks itself).
        chunk_storage_prefix: where shuffles spill (the backend's scratch_dir); None: the
            backend's own default.
        name: a label; a random suffix makes each context's name unique.
        max_execution_retries: whole-run retries after an infrastructure failure (a rerun
            resumes from the finished shards); user errors are never retried.
        max_shard_failures / max_shard_infra_failures: retries of one shard after a user
            error / a lost worker; None: the backend's own budgets.
        intra_shard_execution: `IntraShardExecution.OFF` (the default) or `AUTO`: a stage with
            fewer shards than `max_workers` runs each shard's leading per-item ops (map, filter,
            flat_map, select, with_columns) in max_workers // shards processes, its output and
            order unchanged (`zephyr.execution.intra_shard`); not with shared objects (`put`).
        speculation: when a straggling shard gets a second attempt (`zephyr.execution.speculation`):
            None (the pool's: `$ZEPHYR_SPECULATION`, else on with conservative thresholds), a
            bool, a dict such as `{"multiplier": 2, "min_seconds": 5}`, or a `Speculation`.
        stage_runner_factory: the reference's `InlineRunner`/`SubprocessRunner`
            (`zephyr.runners`); accepted: shard tasks run in the backend's workers, and the
            chunks of a split shard always in fresh processes.
    """

    client: Any = None
    max_workers: int | None = None
    resources: Any = None
    coordinator_resources: Any = None
    chunk_storage_prefix: str | None = None
    name: str = ""
    no_workers_timeout: float | None = None
    max_execution_retries: int = 100
    stage_runner_factory: Callable | None = None
    heartbeat_timeout: float = 120.0
    max_shard_failures: int | None = None
    max_shard_infra_failures: int | None = None
    max_concurrent_pipelines: int = MAX_CONCURRENT_PIPELINES
    intra_shard_execution: IntraShardExecution | str = IntraShardExecution.OFF
    speculation: Any = None

    _shared_data: ContextVar = field(init=False, repr=False)
    _state: _State = field(init=False, default=_State.NEW, repr=False)
    _pool: Backend | None = field(init=False, default=None, repr=False)
    _owns_pool: bool = field(init=False, default=False, repr=False)
    _pool_key: str | None = field(init=False, default=None, repr=False)
    _lock: Any = field(init=False, repr=False)

    def __post_init__(self) -> None:
        if self.max_workers is None and (env := os.environ.get("ZEPHYR_MAX_WORKERS")):
            try:
                self.max_workers = int(env)
            except ValueError as e:
                raise ValueError(f"Invalid ZEPHYR_MAX_WORKERS environment variable value: {env}") from e
        if self.max_workers is not None and (not isinstance(self.max_workers, int) or self.max_workers <= 0):
            raise ValueError(f"max_workers must be a positive integer, got {self.max_workers!r}")
        if self.resources is None:
            self.resources = ResourceConfig(cpu=1, ram="1g")
        if self.no_workers_timeout is None:
            self.no_workers_timeout = 6 * 60 * 60
        if self.client is not None and not isinstance(self.client, (Backend, str)):
            raise TypeError(f"ZephyrContext client must be a zephyr Backend, a backend name or None, got {type(self.client).__name__}")
        self.intra_shard_execution = IntraShardExecution(self.intra_shard_execution)
        if self.speculation is not None:
            self.speculation = speculation_option(self.speculation)  # a bad value fails here, not at execute
        self.name = f"{self.name}-{uuid.uuid4().hex[:8]}"
        self._shared_data = ContextVar(f"zephyr_shared_{self.name}", default=None)
        self._lock = threading.Lock()

    # ---- pickling: a copy borrows the pool --------------------------------------------------

    def __getstate__(self) -> dict:
        state = dict(self.__dict__)
        state["_shared"] = dict(self._shared_data.get() or {})
        for key in ("_shared_data", "_lock", "_pool"):
            state.pop(key)
        if isinstance(self.client, Backend):
            state["client"] = self.client.name
        state["_owns_pool"] = False
        if self._state is _State.OWNER:
            state["_state"] = _State.BORROWED
        return state

    def __setstate__(self, state: dict) -> None:
        shared = state.pop("_shared")
        self.__dict__.update(state)
        self._pool = _POOLS.get(self._pool_key) if self._pool_key else None
        if self._state is _State.BORROWED and self._pool is None:  # another process: a backend of the same kind
            self._pool, self._owns_pool = create_backend(self.client or flow_backend().name, self.max_workers), True
        self._shared_data = ContextVar(f"zephyr_shared_{self.name}", default=None)
        self._shared_data.set(dict(shared))
        self._lock = threading.Lock()

    # ---- shared objects ---------------------------------------------------------------------

    def put(self, name: str, obj: Any) -> None:
        """Share `obj` with the tasks of this thread's later executes (`zephyr_worker_ctx().get_shared(name)`)."""
        if not isinstance(name, str) or not name:
            raise ValueError(f"put() needs a non-empty name, got {name!r}")
        self._shared_data.set({**(self._shared_data.get() or {}), name: obj})

    def load_memory_store(self, dataset, *, name: str, hash_key: Callable, recovery_timeout: float, ready_timeout: float = 900.0):
        """Not available: our backends keep no long-lived worker actors to hold a table."""
        raise NotImplementedError(
            "load_memory_store needs long-lived worker actors holding a partitioned table; this runner has none. "
            "Share a lookup table with ctx.put(name, table) and zephyr_worker_ctx().get_shared(name) instead"
        )

    # ---- the pool ---------------------------------------------------------------------------

    def _new_pool(self) -> tuple[Backend, bool]:
        if isinstance(self.client, Backend):
            return self.client, False
        if self.client is None:
            return flow_backend(), False
        return create_backend(self.client, self.max_workers, **_backend_options(self.resources)), True

    def start(self) -> ZephyrContext:
        """Keep one pool for every execute until `shutdown()` (what `with ctx:` does)."""
        with self._lock:
            if self._state is not _State.NEW:
                raise RuntimeError(f"Cannot start ZephyrContext in state {self._state}")
            scope = _scope.get()
            if scope is not None:
                _check_fits(scope.worker, self.resources, "worker")
                self._pool, self._owns_pool = scope.pool, False
            else:
                self._pool, self._owns_pool = self._new_pool()
            self._pool_key = uuid.uuid4().hex
            _POOLS[self._pool_key] = self._pool
            self._state = _State.OWNER
        return self

    def shutdown(self) -> None:
        """Stop an entered context's pool (a backend it created is closed)."""
        with self._lock:
            if self._state is _State.BORROWED:
                raise RuntimeError("A borrowed ZephyrContext cannot stop its shared pool")
            if self._state is not _State.OWNER:
                return
            pool, owns = self._pool, self._owns_pool
            _POOLS.pop(self._pool_key, None)
            self._pool, self._owns_pool, self._state = None, False, _State.CLOSED
        if owns:
            pool.close()

    def __enter__(self) -> ZephyrContext:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.shutdown()

    @contextlib.contextmanager
    def execution_scope(self) -> Iterator[ZephyrContext]:
        """Run every ZephyrContext executed in this thread inside the block on this context's pool."""
        with self._lock:
            if self._state not in (_State.OWNER, _State.BORROWED) or self._pool is None:
                raise RuntimeError("execution_scope() needs an entered ZephyrContext (with ctx: ...) or a copy of one")
            scope = _Scope(self._pool, self.resources, self._workers(self._pool))
        token = _scope.set(scope)
        try:
            yield self
        finally:
            _scope.reset(token)

    def _workers(self, pool: Backend) -> int:
        return self.max_workers or pool.max_parallelism

    # ---- running ----------------------------------------------------------------------------

    def execute(self, dataset, verbose: bool = False, dry_run: bool = False, *,
                map_task_resources: Any = None, reduce_task_resources: Any = None) -> ZephyrExecutionResult:
        """Run `dataset`; its results in shard order and the run's counters.

        Raises:
            ZephyrWorkerError: a user function or the input failed a shard.
            ValueError: task resources that do not fit one worker (or differ in placement).
        """
        plan = dataset.plan()  # a PlanError surfaces here, before anything runs
        if verbose or dry_run:
            logger.info("zephyr: plan of %s\n%s", self.name, plan.describe())
        if dry_run:
            return ZephyrExecutionResult(results=[], counters={})
        with self._lock:
            if self._state is _State.CLOSED:
                raise RuntimeError("Cannot execute with a closed ZephyrContext")
            pool, scope = self._pool, _scope.get()
        worker = self.resources
        if pool is None and scope is not None:  # a fresh context inside a scope: the scope's pool
            _check_fits(scope.worker, self.resources, "task")
            pool, worker = scope.pool, scope.worker
        map_res, reduce_res = map_task_resources or self.resources, reduce_task_resources or map_task_resources or self.resources
        _check_fits(worker, map_res, "map")
        _check_fits(worker, reduce_res, "reduce")
        owned = None
        if pool is None:
            pool, mine = self._new_pool()
            owned = pool if mine else None
        if getattr(pool, "plans_only", False):  # `zephyr --dry-run`: its backend prints the plan
            pool.execute(dataset)
            return ZephyrExecutionResult(results=[], counters={})
        try:
            return self._run_with_retries(pool, plan, worker, map_res, reduce_res)
        finally:
            if owned is not None:
                owned.close()

    def _run_with_retries(self, pool: Backend, plan, worker, map_res, reduce_res) -> ZephyrExecutionResult:
        per_worker = min(_tasks_per_worker(worker, map_res), _tasks_per_worker(worker, reduce_res))
        task = map_res if ram_bytes(map_res.ram) >= ram_bytes(reduce_res.ram) else reduce_res
        delay = 1.0
        for attempt in range(self.max_execution_retries + 1):
            view = _RunView(pool, self._workers(pool) * per_worker, task, dict(self._shared_data.get() or {}),
                            self.chunk_storage_prefix, self.max_shard_failures, self.max_shard_infra_failures, self.name,
                            self.intra_shard_execution is IntraShardExecution.AUTO, self.speculation)
            try:
                execution = Execution(view, plan)
                results = list(execution)
                return ZephyrExecutionResult(results=results, counters=execution.counters.public())
            except ShardError as e:
                raise ZephyrWorkerError.of(e) from e
            except _NON_RETRYABLE:
                raise
            except Exception as e:
                if attempt >= self.max_execution_retries:
                    raise
                logger.warning("zephyr: run attempt %d of %s failed (%d retries left), retrying in %.0fs: %s",
                               attempt + 1, self.name, self.max_execution_retries - attempt, delay, e)
                time.sleep(delay)
                delay = min(60.0, delay * 2)
            finally:
                view.close()
        raise AssertionError("unreachable")


def _backend_options(worker: Any) -> dict:
    options: dict[str, Any] = {"num_cpus": float(worker.cpu)}
    if ram_bytes(worker.ram):
        options["memory"] = ram_bytes(worker.ram)
    device = getattr(worker, "device", None)
    if isinstance(device, dict):
        options["resources"] = dict(device)
    elif isinstance(device, (int, float)) and device:
        options["num_gpus"] = float(device)
    return options


def _tasks_per_worker(worker: Any, task: Any) -> int:
    """How many copies of `task` fit one worker, by cpu and ram."""
    ratios = [float(worker.cpu) / float(task.cpu)] if float(task.cpu) > 0 else []
    if ram_bytes(task.ram) > 0:
        ratios.append(ram_bytes(worker.ram) / ram_bytes(task.ram))
    return max(1, math.floor(min(ratios))) if ratios else 1


def _check_fits(worker: Any, task: Any, what: str) -> None:
    """ValueError unless `task` fits one worker and asks for the same placement."""
    for name in _PLACEMENT:
        mine, theirs = getattr(task, name, None), getattr(worker, name, None)
        if mine != theirs:
            raise ValueError(f"Task resource field '{name}' must match the worker pool ({mine!r} != {theirs!r})")
    if float(task.cpu) > float(worker.cpu) or ram_bytes(task.ram) > ram_bytes(worker.ram) or \
            ram_bytes(getattr(task, "disk", 0)) > ram_bytes(getattr(worker, "disk", 0)):
        raise ValueError(f"{what} task resources exceed one Zephyr worker; they must fit one Zephyr worker: "
                         f"task={task}, worker={worker}")

