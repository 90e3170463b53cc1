"""sorted_merge_join: a streaming merge of shard i of the left with shard i of the right.

Each match becomes `combiner(left, right)`; an unmatched left item of a left join becomes
`combiner(left, None)`. The default combiner merges dicts, `{**left, **right}` (the right
side wins on shared keys), and keeps an unmatched left item as it is.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

__all__ = ["BoundJoin", "default_combiner", "merge_join"]

_MISSING = object()


@dataclass(frozen=True)
class BoundJoin:
    """A join whose right side is planned: its fused ops and, per shard, its input items."""

    record: Any  # the SortedMergeJoin op
    right_ops: tuple
    right_items: tuple
    right_labels: tuple
    right_fingerprint: str = ""  # the right side's plan (its inputs' versions too), for resume identity

    def describe(self) -> str:
        return self.record.describe()


def default_combiner(left: Any, right: Any) -> Any:
    """`{**left, **right}`; `left` itself when there is no right item (a left join's miss)."""
    if right is None:
        return left
    if not isinstance(left, dict) or not isinstance(right, dict):
        raise TypeError(
            f"sorted_merge_join's default combiner merges dicts, got {type(left).__name__} and {type(right).__name__}; "
            "pass combiner=lambda left, right: ..."
        )
    return {**left, **right}


def merge_join(
    left: Iterator[Any], right: Iterator[Any], left_key, right_key, how: str, shard: int, combiner=None
) -> Iterator[Any]:
    """Join two streams sorted by key; every pair of equal-key items gives `combiner(left, right)`.

    A key unequal to itself (NaN) matches nothing and has no place in the order: right items
    with one are passed over, left ones miss, and neither moves the other side along."""
    combine = combiner if combiner is not None else default_combiner
    lgroups = _groups(left, left_key, "left", shard)
    rgroups = _groups(right, right_key, "right", shard, matchable_only=True)
    rkey, ritems = next(rgroups, (_MISSING, None))
    rights = None  # rkey's right rows, once read: a later left group of that key (after a NaN) meets them too
    for lkey, litems in lgroups:
        if not _unmatchable(lkey):
            while rkey is not _MISSING and _before(rkey, lkey, shard):
                (rkey, ritems), rights = next(rgroups, (_MISSING, None)), None
            if rkey is not _MISSING and rkey == lkey:
                if rights is None:
                    rights = list(ritems)  # one key's right rows; the left group streams against them
                for litem in litems:
                    for ritem in rights:
                        yield combine(litem, ritem)
                continue
        if how == "left":
            for litem in litems:
                yield combine(litem, None)
    # the rest of the right side is read too: a key that goes backwards there may be one the
    # left side had (right [2, 1], left [1]), and must fail the shard, not lose the match
    for _ in rgroups:
        pass


def _unmatchable(key: Any) -> bool:
    """A key unequal to itself (NaN): it can neither match nor be placed in the order."""
    try:
        return bool(key != key)
    except Exception:  # noqa: BLE001 - a key without a truth value here (pandas.NA) is judged by `<` as before
        return False


def _before(a: Any, b: Any, shard: int) -> bool:
    try:
        return a < b
    except TypeError as e:
        raise TypeError(f"sorted_merge_join: shard {shard}'s join keys {a!r} and {b!r} cannot be ordered ({e}); "
                        "both sides must be sorted by keys of one comparable type (not None)") from None


def _groups(stream: Iterator[Any], key, side: str, shard: int, matchable_only: bool = False) -> Iterator[tuple[Any, Iterator[Any]]]:
    """Runs of equal keys. A NaN key is never compared for order (it compares false with
    everything, so `[5, nan, 3]` would pass as sorted); `matchable_only` leaves its items out."""
    keyed = ((key(item), item) for item in stream)
    if matchable_only:
        keyed = (pair for pair in keyed if not _unmatchable(pair[0]))
    previous = _MISSING
    for k, pairs in itertools.groupby(keyed, key=_first):
        items = map(_second, pairs)
        if _unmatchable(k):
            yield k, items
            continue
        if previous is not _MISSING and _before(k, previous, shard):
            raise ValueError(
                f"sorted_merge_join: the {side} input of shard {shard} is not sorted by its key: {k!r} comes after {previous!r}"
            )
        previous = k
        yield k, items


_first = operator.itemgetter(0)
_second = operator.itemgetter(1)
