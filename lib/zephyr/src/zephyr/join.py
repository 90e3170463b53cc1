"""sorted_merge_join: a streaming merge of shard i of the left with shard i of the right."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundJoin", "merge_join"]

_MISSING = object()


@dataclass(frozen=True)
class BoundJoin:
    """A join whose right side is planned: its fused ops and, per shard, its input items."""

    record: Any  # the SortedMergeJoin op
    right_ops: tuple
    right_items: tuple
    right_labels: tuple

    def describe(self) -> str:
        return self.record.describe()


def merge_join(left: Iterator[Any], right: Iterator[Any], left_key, right_key, how: str, shard: int) -> Iterator[tuple]:
    """Join two streams sorted by key; equal keys give every (left, right) pair."""
    lgroups = _groups(left, left_key, "left", shard)
    rgroups = _groups(right, right_key, "right", shard)
    rkey, ritems = next(rgroups, (_MISSING, None))
    for lkey, litems in lgroups:
        while rkey is not _MISSING and rkey < lkey:
            rkey, ritems = next(rgroups, (_MISSING, None))
        if rkey is not _MISSING and rkey == lkey:
            rights = list(ritems)  # one key's right rows; the left group streams against them
            for litem in litems:
                for ritem in rights:
                    yield (litem, ritem)
            rkey, ritems = next(rgroups, (_MISSING, None))
        elif how == "left":
            for litem in litems:
                yield (litem, None)


def _groups(stream: Iterator[Any], key, side: str, shard: int) -> Iterator[tuple[Any, Iterator[Any]]]:
    previous = _MISSING
    for k, items in itertools.groupby(stream, key=key):
        if previous is not _MISSING and k < previous:
            raise ValueError(
                f"sorted_merge_join: the {side} input of shard {shard} is not sorted by its key: {k!r} comes after {previous!r}"
            )
        previous = k
        yield k, items
