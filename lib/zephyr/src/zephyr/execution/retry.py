"""Backoff for attempts lost to transient storage errors: when to try a shard again.

A storage service that answers 503 or drops connections is usually overloaded or briefly down;
resubmitting at once adds to the load. The runner parks such a shard in a `BackoffQueue` for
`backoff_delay(n)` seconds (exponential from the backend's `retry_backoff`, capped, jittered so
that a thousand shards do not come back in step) while other shards keep running.
"""

from __future__ import annotations

import heapq
import itertools
import random
import time
from typing import Any

__all__ = ["MAX_BACKOFF", "BackoffQueue", "backoff_delay"]

MAX_BACKOFF = 60.0  # seconds


def backoff_delay(attempt: int, initial: float, cap: float = MAX_BACKOFF) -> float:
    """Seconds to wait before retry number `attempt` (1, 2, ...): `initial * 2**(attempt-1)`,
    capped at `cap`, times a random factor in [0.5, 1]."""
    return min(cap, initial * 2 ** (attempt - 1)) * random.uniform(0.5, 1.0)


class BackoffQueue:
    """Items waiting until a moment: `push(item, delay)`, `due()` pops those whose time came."""

    def __init__(self):
        self._heap: list[tuple[float, int, Any]] = []
        self._order = itertools.count()  # ties never compare the items themselves

    def __len__(self) -> int:
        return len(self._heap)

    def push(self, item: Any, delay: float) -> None:
        heapq.heappush(self._heap, (time.monotonic() + delay, next(self._order), item))

    def due(self) -> list[Any]:
        now = time.monotonic()
        ready = []
        while self._heap and self._heap[0][0] <= now:
            ready.append(heapq.heappop(self._heap)[2])
        return ready

    def seconds_to_next(self) -> float | None:
        """Until the earliest item is due (0 if one is), or None when empty."""
        return max(0.0, self._heap[0][0] - time.monotonic()) if self._heap else None
