"""Each item's origin, carried through shuffles, so that "the first" means the first in the input.

`deduplicate` keeps, `deduplicate_fuzzy` keeps, and a group's items arrive in, the order of
their *origin*: (source shard, position), packed as one int `shard << 40 | position`. A source
stage's items are numbered by their shard and their position in the stream its scatter takes
(`map`/`filter`/`flat_map` keep file order, so that is file order). A shuffle's runs hold each
record's origin in their `(s, pos)` sort-key columns, which order equal keys; the reduce side
hands each item on with its origin published in the task's `Origin` (the kept record's, a
concatenated record's; for a group's reducer outputs, the group's first item's), and the next
scatter takes the origin published when each item reaches it. Between the two, per-item ops
pull one item and make its outputs before pulling the next, so an output gets the origin of
the item it was made from; an op that reads ahead (`window`, `map_shard`, `map_batches`, a
join) gives its output the origin of the last item it had read. Items of equal origin (made
from one item after a shuffle) are ordered by the map shard and position that scattered them.

Only stages that read a shuffle and end in one publish origins (`tracking`); a source stage
keeps its runs as they were (no origin column: the map shard and position are the origin).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable, Iterator
from typing import Any
from contextlib import contextmanager

import numpy as np

__all__ = ["SHIFT", "Origin", "current", "pack", "paired", "published", "split", "tracking", "unpaired", "use"]

SHIFT = 40  # bits of the position in a packed origin (the shard takes the rest of 63)
_MASK = (1 << SHIFT) - 1
_local = threading.local()


class Origin:
    """The origin of the item the stage's input handed on last (`value`: packed)."""

    __slots__ = ("value",)

    def __init__(self) -> None:
        self.value = 0


def pack(shard: int, position: int) -> int:
    return shard << SHIFT | position


def split(packed: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The (shard int32, position int64) columns of packed origins."""
    packed = np.asarray(packed, dtype=np.int64)
    return (packed >> SHIFT).astype(np.int32), packed & _MASK


def published(items: Iterable[Any], origin: Origin, value: int) -> Iterator[Any]:
    """`items`, with `value` published in `origin` as each is handed on."""
    for item in items:
        origin.value = value
        yield item


def paired(items: Iterable[Any], origin: Origin) -> Iterator[tuple[int, Any]]:
    """(origin, item) pairs of a stream whose origins are published in `origin`."""
    return ((origin.value, item) for item in items)  # the item is taken first, then its origin read


def unpaired(pairs: Iterable[tuple[int, Any]], origin: Origin) -> Iterator[Any]:
    """The items of (origin, item) pairs, each origin published in `origin` as its item is handed on."""
    for value, item in pairs:
        origin.value = value
        yield item


@contextmanager
def tracking(origin: Origin | None) -> Iterator[Origin | None]:
    """Make `origin` the running task's (for `current`) while the task runs; None: no tracking."""
    previous = getattr(_local, "origin", None)
    _local.origin = origin
    try:
        yield origin
    finally:
        _local.origin = previous


def use(origin: Origin) -> None:
    """From now on (within `tracking`), the running task's items publish their origins in `origin`."""
    _local.origin = origin


def current() -> Origin | None:
    """The running task's `Origin`, or None where origins are not tracked (a source stage)."""
    return getattr(_local, "origin", None)
