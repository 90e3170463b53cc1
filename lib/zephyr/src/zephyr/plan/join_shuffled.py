"""sorted_merge_join of two group_by outputs, as one shuffle.

`left.group_by(k, f, num_output_shards=n).sorted_merge_join(right.group_by(k, g, num_output_shards=n), ...)`
compiles to a single scatter whose map shards are the left's and then the right's source
shards (`TwoSided` runs each side's own op chain and tags its items), partitioned by each
side's group key. A reduce task then sees, per key, the left items first and the right items
after (`TaggedOrder`); it reduces each side with its own reducer, applies the per-item ops
each side had between its group_by and the join, and joins the two small result lists by
their join keys (`join_group`). Equal keys meet in the same task because both sides hash the
same key the same way; so each side's join key must be its group key (checked per item).
Output: one shard per partition, groups in the shuffle's (hash, key) order rather than key order.
"""

from __future__ import annotations

import functools
import inspect
import itertools
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

from zephyr.plan import ops as op
from zephyr.errors import PlanError
from zephyr.shuffle.join import default_combiner
from zephyr.shuffle.keys import key_bytes
from zephyr.shuffle.reduce import HashPartition, ReduceGroups, ScatterSink, ShuffleReader

__all__ = ["TwoSided", "join_shuffled"]

_PER_ITEM = op.PER_ITEM_OPS


@dataclass(frozen=True, slots=True)
class Tagged:
    """An item of one side (0: left, 1: right) on its way through the shared shuffle."""

    side: int
    item: Any


@dataclass(frozen=True)
class TwoSided:
    """Stage 0 of the joint shuffle: shards below `num_left` run the left chain, the rest the right's."""

    left_ops: tuple
    right_ops: tuple
    num_left: int
    num_right: int
    right_fingerprint: str  # the right side's plan (sources and their versions) in this stage's identity

    def tagged(self, side: int, stream: Iterator) -> Iterator[Tagged]:
        return (Tagged(side, item) for item in stream)

    def describe(self) -> str:
        chain = lambda ops: " -> ".join(o.describe() for o in ops) or "items"  # noqa: E731
        return f"left [{chain(self.left_ops)}] + right [{chain(self.right_ops)}]"


@dataclass(frozen=True)
class TaggedKey:
    left: Any
    right: Any

    def __call__(self, tagged: Tagged) -> Any:
        return (self.right if tagged.side else self.left)(tagged.item)


@dataclass(frozen=True)
class TaggedOrder:
    """Left items before right ones within a key; each side by its own sort_by, if any."""

    left: Any
    right: Any

    def __call__(self, tagged: Tagged) -> tuple:
        sort_by = self.right if tagged.side else self.left
        return (tagged.side, sort_by(tagged.item) if sort_by is not None else 0)


@dataclass(frozen=True)
class TaggedCombiner:
    """Each side's own group_by combiner on its part of a key's items (left part first)."""

    left: Any
    right: Any

    def __call__(self, key: Any, items: Iterator[Tagged]) -> Iterator[Tagged]:
        for side, part in itertools.groupby(items, key=lambda t: t.side):
            combiner = self.right if side else self.left
            plain = (t.item for t in part)
            if combiner is None:
                out = plain
            else:
                result = combiner(key, plain)
                out = result if isinstance(result, Iterator) else [result]
            yield from (Tagged(side, item) for item in out)


@dataclass(frozen=True)
class JoinSpec:
    left_reducer: Any
    left_ops: tuple
    right_reducer: Any
    right_ops: tuple
    left_key: Any
    right_key: Any
    how: str
    combiner: Any

    def describe(self) -> str:
        return f"sorted_merge_join(how={self.how}) of two group_by outputs"


class _Sides:
    """Splits a key's tagged items (left first) into the two sides' item streams, in one pass."""

    def __init__(self, items: Iterator[Tagged]):
        self._items = items
        self._first_right: list[Tagged] = []

    def lefts(self) -> Iterator[Any]:
        if self._first_right:
            return
        for tagged in self._items:
            if tagged.side:
                self._first_right.append(tagged)
                return
            yield tagged.item

    def rights(self) -> Iterator[Any]:
        for _ in self.lefts():  # whatever the left reducer left unread
            pass
        return (t.item for t in itertools.chain(self._first_right, self._items))


def _outputs(reducer: Any, key: Any, items: Iterator[Any], ops: tuple) -> list:
    """A side's items for `key`: its group_by reducer's, by group_by's rule (a generator function
    yields several items, anything else returns one, even an iterator), then its per-item ops."""
    result = reducer(key, items)
    stream = result if inspect.isgeneratorfunction(reducer) else iter([result])
    for one in ops:  # per-item ops only (`_PER_ITEM`)
        stream = one.apply(stream)
    return list(stream)


def join_group(spec: JoinSpec, key: Any, items: Iterator[Tagged]) -> Iterator[Any]:
    """One key's join: reduce each side, then every left result with its matching right ones."""
    items = iter(items)
    first = next(items)
    if first.side:  # a key only the right side has: nothing for an inner or a left join
        return
    sides = _Sides(itertools.chain([first], items))
    lefts = _outputs(spec.left_reducer, key, sides.lefts(), spec.left_ops)
    rights_in = sides.rights()
    peeked = next(rights_in, _NONE)
    rights = [] if peeked is _NONE else _outputs(spec.right_reducer, key, itertools.chain([peeked], rights_in), spec.right_ops)
    right_keys = [_own_key(spec.right_key, r, key, "right") for r in rights]
    combine = spec.combiner if spec.combiner is not None else default_combiner
    for left in lefts:
        lkey = _own_key(spec.left_key, left, key, "left")
        matched = False
        for right, rkey in zip(rights, right_keys):
            if rkey == lkey:  # the shuffle's key bytes of each: see _own_key
                matched = True
                yield combine(left, right)
        if not matched and spec.how == "left":
            yield combine(left, None)


_NONE = object()


def _own_key(key_fn: Any, item: Any, group_key: Any, side: str) -> bytes:
    """The item's join key as the shuffle's key bytes (1, 1.0 and True differ; NaN is one key,
    as in its group_by), checked to be its group's key."""
    value = key_fn(item)
    encoded = key_bytes(value)
    if encoded != key_bytes(group_key):
        raise ValueError(
            f"sorted_merge_join of two group_by outputs: the {side} join key of {item!r} is {value!r}, but it came "
            f"from the group of key {group_key!r}; each side's join key must be its group_by key"
        )
    return encoded


def join_shuffled(record: Any, left_stage: Any, left_group: Any, between: list, right_plan: Any, right_group: Any):
    """The joint map stage's (ops, input, sink) and the reduce stage's reader, for `record`
    (a SortedMergeJoin) of the left group_by `left_group` (planned as `left_stage`, then the
    per-item ops `between`) with a right side planned as `right_plan` ending in `right_group`."""
    n_left = left_stage.sink.num_partitions
    n_right = right_plan.stages[0].sink.num_partitions if right_plan.stages[0].sink is not None else 0
    if n_left != n_right:
        raise PlanError(
            f"sorted_merge_join needs co-partitioned inputs: the left group_by has {n_left} output shards and the right "
            f"one {n_right}; give both the same num_output_shards"
        )
    right_source, right_reduce = right_plan.stages
    for what, ops in (("left", between), ("right", right_reduce.ops)):
        odd = [o.describe() for o in ops if not isinstance(o, _PER_ITEM)]
        if odd:
            raise PlanError(f"sorted_merge_join of two group_by outputs: the {what} side's {', '.join(odd)} between its "
                            "group_by and the join is not a per-item op (map, filter, flat_map, select)")
    two_sided = TwoSided(left_stage.ops, right_source.ops, left_stage.num_shards, right_source.num_shards, right_plan.fingerprint)
    partition = HashPartition(TaggedKey(left_group.key, right_group.key), TaggedOrder(left_group.sort_by, right_group.sort_by),
                              TaggedCombiner(left_group.combiner, right_group.combiner)
                              if left_group.combiner is not None or right_group.combiner is not None else None)
    spec = JoinSpec(left_group.reducer, tuple(between), right_group.reducer, right_reduce.ops, record.left_key, record.right_key,
                    record.how, record.combiner)
    reader = ShuffleReader(n_left, ReduceGroups(functools.partial(join_group, spec)), spec.describe(), sorted_by_value=True)
    inputs = tuple(left_stage.input) + tuple(right_source.input)
    return (two_sided,), inputs, ScatterSink(n_left, partition), reader
