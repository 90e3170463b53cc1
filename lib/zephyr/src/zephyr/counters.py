"""User counters: `zephyr.counters.increment("dropped/short", 1)` inside any user function.

Each shard task collects its own counts (thread-local, so threadpool shards never mix) and
returns them with its result; the runner adds them up per run. Outside a running shard,
`increment` does nothing, so the same function works in a plain unit test.
"""

from __future__ import annotations

import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["collecting", "current", "increment"]

_local = threading.local()


def increment(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name` of the shard being run (no-op outside a run)."""
    current = getattr(_local, "counts", None)
    if current is not None:
        current[name] += n


def current() -> dict:
    """A copy of the counts of the shard being run so far ({} outside a run)."""
    counts = getattr(_local, "counts", None)
    return dict(counts) if counts is not None else {}


@contextmanager
def collecting() -> Iterator[Counter]:
    """Collect the increments made in this thread into a fresh Counter (used by shard tasks)."""
    previous = getattr(_local, "counts", None)
    counts: Counter = Counter()
    _local.counts = counts
    try:
        yield counts
    finally:
        _local.counts = previous
