"""The sync backend: runs each shard inline, one at a time, in the driver. For tests and debugging."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zephyr.backends.base import Backend
from zephyr.execution.pool import Finished, run_inline

__all__ = ["SyncBackend"]


class SyncBackend(Backend):
    name = "sync"
    inline = True

    @classmethod
    def default_parallelism(cls) -> int:
        return 1

    def submit(self, fn: Callable, shared: Any, arg: Any) -> Finished:
        return run_inline(self.bound(fn), shared, arg)

    def wait(self, handles: Sequence[Finished], timeout: float | None = None) -> list[Finished]:
        return list(handles)

    def result(self, handle: Finished) -> Any:
        return handle.get()
