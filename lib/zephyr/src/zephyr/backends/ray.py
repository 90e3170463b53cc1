"""The Ray backend: one Ray task per shard per stage, a bounded window driven by `ray.wait`.

Connects to `address` (or `RAY_ADDRESS`) when given. Else, with `local_ray="embedded"` (the
default for library use), starts an embedded local Ray and shuts it down on `close()`; with
`local_ray="reuse"` (the `zephyr` command's default), connects to a local Ray that outlives the
run, started by an earlier run or with `ray start` (`zephyr.backends.ray_reuse`), and disconnects
on `close()`. A driver that already called `ray.init()` is used as it is. Token-authenticated clusters need nothing here: Ray reads
`RAY_AUTH_MODE=token` and the token (`RAY_AUTH_TOKEN_PATH` or `~/.ray/auth_token`) itself.

Failures are sorted for the runner: a task the cluster lost (its worker or node died, see
`zephyr.backends.ray_errors` for the list) is `TaskLost` (Ray has already retried it
`ray_task_retries` times at the system level; the runner resubmits it without charging the
user's budget); an exception raised by user code arrives as the
`ShardError` the task raised. The stage program goes into the object store once per stage;
tasks carry only shard descriptors (paths, indices). A straggler's second attempt
(`submit_again`) asks Ray for any node but the one its first attempt runs on (the
`ray.io/node-id` label), when another node is alive.
"""

from __future__ import annotations

import contextlib
import logging
import os
import signal
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from zephyr.backends.base import Backend, TaskLost
from zephyr.backends.ray_local import describe_ray, start_local_ray
from zephyr.backends.ray_reuse import connect_reused
from zephyr.backends.ray_warm import warm_next_run
from zephyr.backends.ray_errors import lost_cause, out_of_memory_cause
from zephyr.backends.ray_crashes import CrashWatch
from zephyr.backends.ray_running import RunningMarks, call_marked
from zephyr.execution.memory import MIN_TASK_MEMORY
from zephyr.status.crashes import describe_crash
from zephyr.out_of_memory import TaskOutOfMemory
from zephyr.errors import ShardError
from zephyr.execution.interrupts import wait_slice
from zephyr.backends.shared import RemoteObject

__all__ = ["RayBackend"]

logger = logging.getLogger("zephyr")

NODE_LABEL = "ray.io/node-id"  # the label Ray gives every node: its id
LOCAL_RAY = ("embedded", "reuse")  # what a backend without an address runs on (`local_ray`)


@contextlib.contextmanager
def _keeping_sigterm_handler():
    """`ray.init` replaces the driver's SIGTERM handler with `sys.exit`; keep one that the
    program installed (the `zephyr` command's turns SIGTERM into a clean interrupt)."""
    previous = signal.getsignal(signal.SIGTERM) if threading.current_thread() is threading.main_thread() else None
    try:
        yield
    finally:
        if callable(previous):
            signal.signal(signal.SIGTERM, previous)


class RayBackend(Backend):
    name = "ray"
    default_user_retries = 1
    requires_pickling = True

    def __init__(self, max_parallelism: int | None = None, *, address: str | None = None, ray_task_retries: int = 3,
                 init_kwargs: dict | None = None, verbose: bool = False, local_ray: str = "embedded", **options):
        super().__init__(max_parallelism, **options)
        if local_ray not in LOCAL_RAY:
            raise ValueError(f"local_ray must be one of {', '.join(LOCAL_RAY)}; got {local_ray!r}")
        self.address = address or os.environ.get("RAY_ADDRESS") or None
        self.local_ray = local_ray
        self.ray_task_retries = ray_task_retries
        self.init_kwargs = dict(init_kwargs or {})
        self.verbose = verbose  # False: Ray's own INFO/WARNING lines stay in its log files
        self.where: str | None = None  # one line saying where Ray is, once it started
        self.on_start: list[Callable[[str], None]] = []  # called with `where` when Ray starts or connects
        self._remote = None
        self._sized: dict[int, Any] = {}  # task memory budget -> the remote function asking for it
        self._owns_ray = False  # this backend started Ray (embedded) or connected to it (reuse): it ends that on close
        self._reused = None  # reuse: the connection (its lease keeps zephyr's local Ray up while this run uses it)
        self._busy = 0  # the most calls in flight at once: how many workers to start ahead for the next run
        self._running = RunningMarks()  # which tasks run now, which wait for a CPU
        self._crashes = CrashWatch()  # worker processes of this job that crashed (ray_crashes)
        self._reported: set[tuple[str, int]] = set()  # crashes a run has reported
        self._since = time.time()

    @classmethod
    def default_parallelism(cls) -> int:
        return 200

    def _ray(self):
        import ray

        if not ray.is_initialized():
            local = self.local_ray if self.address is None else None
            logger.info("zephyr: %s", f"connecting to Ray at {self.address}" if self.address else f"a local Ray ({local})")
            kwargs = {"log_to_driver": True, **self.init_kwargs}
            with _keeping_sigterm_handler():
                if local == "embedded":  # a fresh embedded Ray even when a `ray start` cluster runs on this machine
                    self.where = start_local_ray(self.verbose, **kwargs)
                elif local == "reuse":
                    self._reused = connect_reused(self.verbose, kwargs)
                    self.where = self._reused.where
                else:
                    context = ray.init(**{"address": self.address, **kwargs})
                    self.where = describe_ray(context, embedded=False)
            self._owns_ray = local is not None
            for callback in self.on_start:
                callback(self.where)
        if self._remote is None:
            self._crashes.start()
            res = self.task_resources
            options: dict[str, Any] = {
                "name": "zephyr_shard",  # how Ray's logs and dashboard name the tasks
                "num_cpus": res.num_cpus,
                "max_retries": self.ray_task_retries,
                "retry_exceptions": False,
            }
            if res.num_gpus:
                options["num_gpus"] = res.num_gpus
            if res.memory:
                options["memory"] = res.memory
            if res.resources:
                options["resources"] = dict(res.resources)
            self._remote = ray.remote(call_marked).options(**options)
            self._options = options
            self._sized = {}
        return ray

    def _remote_for(self, memory: int | None, avoid: str | None = None) -> Any:
        """The remote function asking Ray for `memory` bytes (a task's budget, which the runner
        sizes from measurement: `zephyr.execution.memory`), or the backend's own request; with
        `avoid`, for any node but that one (a straggler's second attempt: rare, not cached)."""
        if avoid is not None:
            import ray

            options = {**self._options, **({"memory": memory} if memory else {}), "label_selector": {NODE_LABEL: f"!{avoid}"}}
            return ray.remote(call_marked).options(**options)
        if memory is None or memory == self.task_resources.memory:
            return self._remote
        if memory not in self._sized:
            import ray

            self._sized[memory] = ray.remote(call_marked).options(**{**self._options, "memory": memory})
        return self._sized[memory]

    def memory_ceiling(self) -> int:
        """The most memory a task may be given without the `memory` option: the smallest alive
        node's memory resource, shared among the tasks its CPUs run at once."""
        ray = self._ray()
        num_cpus = self.task_resources.num_cpus
        shares = []
        for node in ray.nodes():
            resources = node.get("Resources") or {}
            memory, cpus = resources.get("memory", 0), resources.get("CPU", 0)
            if node.get("Alive") and memory and cpus:
                shares.append(memory * min(1.0, num_cpus / cpus) if num_cpus else memory / cpus)
        return max(MIN_TASK_MEMORY, int(min(shares))) if shares else super().memory_ceiling()

    def share(self, obj: Any) -> Any:
        return self._ray().put(obj)

    def _store(self, name: str, obj: Any) -> Any:
        ray = self._ray()
        try:
            return RemoteObject(ray.put(obj))
        except Exception as e:
            raise TypeError(f"put({name!r}): the object cannot be stored in Ray's object store: {type(e).__name__}: {e}") from e

    def submit(self, fn: Callable, shared: Any, arg: Any) -> Any:
        self._ray()
        key = self._running.new_key()
        handle = self._remote_for(getattr(arg, "memory", None)).remote(self.bound(fn), shared, arg, key)
        self._running.remember(handle, key)
        self._busy = max(self._busy, self._running.in_flight)
        return handle

    def submit_again(self, fn: Callable, shared: Any, arg: Any, first: Any) -> Any:
        """A second attempt of `first`'s call, on another node than `first`'s when one is alive
        (else anywhere: Ray may place it beside the first)."""
        ray = self._ray()
        node = self._running.node(first)
        others = node is not None and any(n.get("Alive") and n["NodeID"] != node and (n.get("Resources") or {}).get("CPU")
                                          for n in ray.nodes())
        if not others:
            where = "not known" if node is None else f"{node}, the only node with CPUs alive"
            logger.info("zephyr: the first attempt's node is %s; Ray places the second attempt anywhere", where)
        key = self._running.new_key()
        remote = self._remote_for(getattr(arg, "memory", None), avoid=node if others else None)
        handle = remote.remote(self.bound(fn), shared, arg, key)
        self._running.remember(handle, key)
        return handle

    def running_since(self, handles: Sequence[Any]) -> dict | None:
        """When each running call began (epoch seconds), from its mark (`zephyr.backends.ray_running`)."""
        import ray

        return self._running.since(handles) if ray.is_initialized() else None

    def placement(self, handle: Any) -> str | None:
        """The id of the node the call runs on, once it has started."""
        import ray

        return self._running.node(handle) if ray.is_initialized() else None

    def started(self, handles: Sequence[Any]) -> set | None:
        """The tasks running now; the others wait in Ray's queue (`zephyr.backends.ray_running`)."""
        import ray

        return self._running.started(handles) if ray.is_initialized() else None

    def wait(self, handles: Sequence[Any], timeout: float | None = None) -> list[Any]:
        ray = self._ray()
        done, rest = ray.wait(list(handles), num_returns=1, timeout=wait_slice(timeout))
        if rest:
            more, _ = ray.wait(rest, num_returns=len(rest), timeout=0)
            done.extend(more)
        return done

    def result(self, handle: Any) -> Any:
        ray = self._ray()
        self._running.forget(handle)
        try:
            return ray.get(handle)
        except Exception as e:
            cause = getattr(e, "cause", None) if isinstance(e, ray.exceptions.RayTaskError) else None
            if isinstance(cause, ShardError):
                raise cause from None
            lost = lost_cause(e)  # Ray's OOM kill, a cancel, an unpicklable argument: not lost
            if lost is not None:
                raise TaskLost(f"{type(lost).__name__}: {lost}") from e
            killed = out_of_memory_cause(e)  # the runner retries it with a bigger budget
            if killed is not None:
                raise TaskOutOfMemory(f"{type(killed).__name__}: {killed}") from e
            raise

    def process_crashes(self, since: float) -> list[dict]:
        """The worker processes of this job that crashed since `since` (epoch seconds), which
        a run reports (`zephyr.backends.ray_crashes`); each is reported once."""
        import ray

        if not ray.is_initialized():
            return []
        crashes = self._crashes.crashes(since)
        self._reported.update((c["host"], c["pid"]) for c in crashes)
        return crashes

    def spans_machines(self) -> bool:
        import ray

        if self.address is None and self.local_ray == "embedded" and not ray.is_initialized():
            return False  # the embedded Ray this backend would start is this machine alone
        ray = self._ray()
        addresses = {node["NodeManagerAddress"] for node in ray.nodes() if node.get("Alive")}
        return len(addresses) > 1

    def cancel(self, handles: Sequence[Any]) -> None:
        import ray

        for handle in handles:
            self._running.forget(handle)
            try:
                ray.cancel(handle)
            except Exception:  # already finished or its node is gone
                pass

    def close(self) -> None:
        import ray

        super().close()  # drops the shared objects' references, so Ray can free them
        if ray.is_initialized() and self._remote is not None:
            self._running.clear()
            for crash in self._crashes.crashes(self._since):  # after the last run: seen now or never
                if (crash["host"], crash["pid"]) not in self._reported:
                    logger.warning("zephyr: after the run, a %s", describe_crash(crash))
        self._crashes.stop()
        reused, self._reused = self._reused, None
        if reused is not None and reused.head is not None and ray.is_initialized():
            warm_next_run(reused.head, self._busy, self.task_resources.num_cpus)
        self._busy = 0
        if self._owns_ray and ray.is_initialized():
            ray.shutdown()
        if reused is not None and reused.lease is not None:
            reused.lease.release()
        self._owns_ray = False
        self._remote = None
        self._sized = {}
