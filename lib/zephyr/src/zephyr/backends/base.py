"""The narrow backend interface: submit a picklable call, wait for some to finish, fetch results.

Everything else (fusion, bounded windows, retries, ordering, skip_existing, counters, progress)
lives once in `zephyr.execution.runner`. A backend maps its own failure kinds onto two exceptions:
`ShardError` (the user's code or input failed; counts against a small budget, unless the task
marked it `transient`: a storage error, retried like a loss after a backoff) and `TaskLost`
(the worker or node died; retried many times without counting).
"""

from __future__ import annotations

import functools
import logging
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from typing import Any, ClassVar

from zephyr.backends.shared import call_with_shared
from zephyr.cost import check_price, price_from_env
from zephyr.errors import TaskLost
from zephyr.execution.quarantine import DEFAULT_MAX_QUARANTINED, check_max_quarantined, check_on_shard_failure
from zephyr.execution.memory import node_memory_ceiling
from zephyr.execution.runner import Execution
from zephyr.execution.speculation import OFF, Speculation, speculation_option
from zephyr.resources import TaskResources, format_memory

__all__ = ["Backend", "TaskLost"]

logger = logging.getLogger("zephyr")


class Backend(ABC):
    """Runs shard tasks. Create with `zephyr.create_backend(name, ...)`."""

    name: ClassVar[str]
    default_user_retries: ClassVar[int] = 0
    requires_pickling: ClassVar[bool] = False  # tasks leave the process, so their functions must pickle
    inline: ClassVar[bool] = False  # calls run one at a time in `submit` (sync): none is ever a straggler to copy
    # processes a stage of fewer shards may split its shards' per-item ops over (0: no
    # intra-shard execution; `ZephyrContext(intra_shard_execution="auto")` sets its max_workers)
    intra_shard_workers: int = 0

    def __init__(
        self,
        max_parallelism: int | None = None,
        *,
        memory: int | str | None = None,
        num_cpus: float = 1.0,
        num_gpus: float = 0.0,
        resources: dict | None = None,
        max_user_retries: int | None = None,
        max_infra_retries: int = 100,
        retry_backoff: float = 1.0,
        progress: bool | None = None,
        scratch_dir: str | None = None,
        on_shard_failure: str = "fail",
        max_quarantined: int | float | None = DEFAULT_MAX_QUARANTINED,
        price_per_core_hour: float | None = None,
        speculation: Speculation | bool | dict | str | None = None,
    ):
        if max_parallelism is None:
            max_parallelism = self.default_parallelism()
        if not isinstance(max_parallelism, int) or isinstance(max_parallelism, bool) or max_parallelism <= 0:
            raise ValueError(f"max_parallelism must be a positive integer, got {max_parallelism!r}")
        self.max_parallelism = max_parallelism
        self.task_resources = TaskResources(num_cpus=num_cpus, num_gpus=num_gpus, memory=memory, resources=dict(resources or {}))
        self.max_user_retries = self.default_user_retries if max_user_retries is None else int(max_user_retries)
        self.max_infra_retries = int(max_infra_retries)
        if self.max_user_retries < 0 or self.max_infra_retries < 0:
            raise ValueError("retry budgets must be >= 0")
        if not retry_backoff >= 0:
            raise ValueError(f"retry_backoff must be >= 0 seconds, got {retry_backoff!r}")
        self.retry_backoff = float(retry_backoff)
        self.progress = progress
        self.scratch_dir = scratch_dir
        self.on_shard_failure = check_on_shard_failure(on_shard_failure)  # "fail" fast, or "quarantine" and go on
        self.max_quarantined = check_max_quarantined(max_quarantined)  # per stage: shards, or a fraction of them
        # what a core-hour costs, to price each stage's CPU seconds (zephyr.cost); None: unpriced
        self.price_per_core_hour = check_price(price_per_core_hour) if price_per_core_hour is not None else price_from_env()
        # second attempts of stragglers (zephyr.execution.speculation); None: $ZEPHYR_SPECULATION, else on
        self.speculation = speculation_option(speculation)
        if self.inline and self.speculation.enabled:
            if speculation not in (None, False):
                logger.info("zephyr: the %s backend runs one shard at a time, so no straggler gets a second attempt", self.name)
            self.speculation = OFF
        self.on_finish: list[Callable] = []
        self._shared: dict[str, Any] = {}

    @classmethod
    def default_parallelism(cls) -> int:
        return os.cpu_count() or 1

    # ---- the interface a backend implements ----------------------------------------------

    def share(self, obj: Any) -> Any:
        """Make `obj` available to every task of a stage (Ray puts it in the object store once)."""
        return obj

    # ---- shared objects (see zephyr.backends.shared) ---------------------------------------

    def put(self, name: str, obj: Any) -> None:
        """Share `obj` with every task of this backend's runs under `name` (`zephyr.get_shared(name)`).

        Ray stores it in the object store once; the local backends keep a plain reference
        (the same object in every task: do not mutate it). A later `put` of the same name
        replaces it for the runs that start afterwards.
        """
        if not isinstance(name, str) or not name:
            raise ValueError(f"put() needs a non-empty name, got {name!r}")
        self._shared[name] = self._store(name, obj)

    def _store(self, name: str, obj: Any) -> Any:
        """What the registry holds for a put object (Ray: a reference into the object store)."""
        return obj

    def bound(self, fn: Callable) -> Callable:
        """`fn` wrapped so that it runs with this backend's shared objects installed."""
        return functools.partial(call_with_shared, dict(self._shared), fn)

    @abstractmethod
    def submit(self, fn: Callable, shared: Any, arg: Any) -> Any:
        """Start `fn(shared, arg)`; return a hashable handle."""

    @abstractmethod
    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
        """Block until at least one handle is finished (or `timeout` passes); return the finished ones.

        May return none sooner (the runner waits again): a wait that blocks in C must wake
        every `zephyr.execution.interrupts.WAIT_SLICE` so that an interrupt sent to its thread lands."""

    @abstractmethod
    def result(self, handle: Any) -> Any:
        """The value of a finished call; raises ShardError or TaskLost."""

    def submit_again(self, fn: Callable, shared: Any, arg: Any, first: Any) -> Any:
        """Start a second attempt of the call `first` is running (a straggler), away from where
        `first` runs where the backend can choose (Ray: another node); here, another thread
        like any call. Returns its handle."""
        return self.submit(fn, shared, arg)

    def running_since(self, handles: Sequence[Any]) -> dict | None:
        """When each of `handles` (calls in flight) began running, in epoch seconds, for those
        that have; None: every call starts when submitted (the local backends)."""
        return None

    def placement(self, handle: Any) -> str | None:
        """Where the call runs (Ray: its node's id), where the backend can tell; else None."""
        return None

    def started(self, handles: Sequence[Any]) -> set | None:
        """Which of `handles` (calls not yet finished) have begun to run; the others wait in the
        backend's own queue (Ray holds tasks until a CPU is free). None: it cannot tell. Here
        every call starts when submitted (threadpool has a thread per call the runner keeps in
        flight; sync runs it inline)."""
        return set(handles)

    def cancel(self, handles: Sequence[Any]) -> None:
        """Best effort: stop calls that are still running (after a fatal error)."""

    def drain(self, handles: Sequence[Any], timeout: float = 120.0) -> None:
        """Wait (bounded) for calls to end after a fatal error, so that none keeps writing
        after the run has raised; their results are dropped."""
        remaining = list(handles)
        deadline = time.monotonic() + timeout
        while remaining and time.monotonic() < deadline:
            done = set(self.wait(remaining, timeout=max(0.0, deadline - time.monotonic())))
            remaining = [h for h in remaining if h not in done]

    def memory_ceiling(self) -> int:
        """The most memory a task may be given without the `memory` option
        (`zephyr.execution.memory`): this machine's share for each of `max_parallelism` tasks."""
        return node_memory_ceiling(self.max_parallelism)

    def spans_machines(self) -> bool:
        """Whether tasks may run on other machines (so scratch must be shared storage)."""
        return False

    def close(self) -> None:
        """Release what the backend holds (threads, a Ray it started, shared objects).
        Subclasses release their own and then call this, which drops the shared objects."""
        self._shared.clear()

    # ---- running pipelines -------------------------------------------------------------------

    def execute(self, dataset) -> Any:
        """Run `dataset`; returns an iterator over its results in shard order.

        The plan is compiled and every stage's functions are checked for picklability now, so
        such errors surface here; the tasks run as you iterate (e.g. `list(backend.execute(ds))`).
        The returned `Execution` also carries `.counters` and per-stage `.stats`.
        """
        return Execution(self, dataset)

    def describe(self) -> str:
        res = self.task_resources
        parts = [f"max_parallelism={self.max_parallelism}", f"num_cpus={res.num_cpus}"]
        if res.num_gpus:
            parts.append(f"num_gpus={res.num_gpus}")
        if res.memory:
            parts.append(f"memory={format_memory(res.memory)}")
        if res.resources:
            parts.append(f"resources={res.resources}")
        return f"{self.name}({', '.join(parts)})"

    def __repr__(self) -> str:
        return self.describe()
