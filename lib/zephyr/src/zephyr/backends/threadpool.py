"""The threadpool backend: shards run on a bounded pool of threads in the driver process.

Good for I/O-bound pipelines and tests; CPU-bound Python code is limited by the GIL (use `ray`).
`cancel` stops a running shard by raising `zephyr.execution.interrupts.Interrupted` inside it (its
atomic writes remove their temporaries); a shard blocked in a C call stops when that call returns.
"""

from __future__ import annotations

import concurrent.futures as cf
from collections.abc import Callable, Sequence
from typing import Any

from zephyr.backends.base import Backend
from zephyr.execution.interrupts import Cancelled, ThreadInterrupter, wait_slice

__all__ = ["ThreadpoolBackend"]


class ThreadpoolBackend(Backend):
    name = "threadpool"

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._pool: cf.ThreadPoolExecutor | None = None
        self._interrupters: dict[cf.Future, ThreadInterrupter] = {}

    def _executor(self) -> cf.ThreadPoolExecutor:
        if self._pool is None:
            self._pool = cf.ThreadPoolExecutor(max_workers=self.max_parallelism, thread_name_prefix="zephyr-shard")
        return self._pool

    def submit(self, fn: Callable, shared: Any, arg: Any) -> cf.Future:
        interrupter = ThreadInterrupter(Cancelled)
        future = self._executor().submit(interrupter.call, self.bound(fn), shared, arg)
        self._interrupters[future] = interrupter
        future.add_done_callback(lambda done: self._interrupters.pop(done, None))
        return future

    def wait(self, handles: Sequence[cf.Future], timeout: float | None = None) -> list[cf.Future]:
        done, _ = cf.wait(handles, timeout=wait_slice(timeout), return_when=cf.FIRST_COMPLETED)
        return list(done)

    def result(self, handle: cf.Future) -> Any:
        return handle.result()

    def cancel(self, handles: Sequence[cf.Future]) -> None:
        for handle in handles:
            if not handle.cancel():  # running: interrupt it
                interrupter = self._interrupters.get(handle)
                if interrupter is not None:
                    interrupter.interrupt()

    def close(self) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None
        super().close()
