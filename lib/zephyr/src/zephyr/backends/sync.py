"""The sync backend: runs each shard inline, one at a time, in the driver. For tests and debugging."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from zephyr.backends.base import Backend

__all__ = ["SyncBackend"]


class _Finished:
    __slots__ = ("value", "error")

    def __init__(self, value: Any = None, error: BaseException | None = None):
        self.value = value
        self.error = error


class SyncBackend(Backend):
    name = "sync"

    @classmethod
    def default_parallelism(cls) -> int:
        return 1

    def submit(self, fn: Callable, shared: Any, arg: Any) -> _Finished:
        try:
            return _Finished(value=self.bound(fn)(shared, arg))
        except Exception as e:
            return _Finished(error=e)

    def wait(self, handles: Sequence[_Finished], timeout: float | None = None) -> list[_Finished]:
        return list(handles)

    def result(self, handle: _Finished) -> Any:
        if handle.error is not None:
            raise handle.error
        return handle.value

