"""A plain-Python model of Zephyr's Dataset ops, written from the docs, not from the code.

A dataset is a list of shards, each a list of records. Each op below states its meaning in a
few lines, taken from the README's op table and the `Dataset` docstrings. It imports nothing
from zephyr: the test compares the two.

Per-shard ops are generators, as Zephyr streams: `take_per_shard` stops reading its shard,
so an error in a record past the first `n` is never raised (by either side).

What the docs leave open is made explicit with `Model.exact`:
- exact: shard i holds exactly these records, in this order (sources, per-item ops, window,
  window_by, take_per_shard, map_shard, sorted_merge_join, and the one shard of count/reduce);
- not exact (a bag): only the multiset of records and the number of shards are defined.
  `group_by`, `deduplicate` and `reshard` say which records come out, not where or in which
  order (partitions are hash ranges; reshard keeps each output shard in input order but
  does not say which shard an item lands in).
Ops that see placement (window, take_per_shard, map_shard, order-sensitive `reduce`, joins)
are only modelled on an exact dataset: after a shuffle, the test gives the model the shards
Zephyr made (once they match the bag and the shard count) and goes on from there.

"The first" (keep-first `deduplicate`, a group's item order) is the first in the pipeline's
input, whatever shuffles came before (docs: "Origins"). `Model.in_input_order` says whether
`records()` lists the records in that order: true for the input and per-item ops on it, and
for a shuffle's output of such records (a bag lists kept records, groups' outputs and
resharded records in the order of their first item); false for shards taken from Zephyr, and
after a group_by whose outputs' origin the docs leave open (with `sort_by` or a combiner).

Equality is `canon(a) == canon(b)`: type-exact (`1`, `1.0` and `True` differ, a tuple is not a
list), NaN equals NaN, `0.0` and `-0.0` differ, dict key order counts. Shuffle keys are equal
when their `canon` is equal: the docs' "equal keys, equal bytes" with a type-exact reading.
"""

from __future__ import annotations

import dataclasses
import inspect
import itertools
from collections.abc import Callable, Iterable, Iterator
from typing import Any, NamedTuple


def canon(value: Any) -> tuple:
    """A totally ordered token of `value`: equal tokens iff the values are strictly equal."""
    t = type(value)
    if value is None:
        return ("none",)
    if t is bool:
        return ("bool", value)
    if t is int:
        return ("int", value)
    if t is float:
        return ("float", "nan" if value != value else value.hex())
    if t is str:
        return ("str", value)
    if t is bytes:
        return ("bytes", value)
    if t in (list, tuple):
        return (t.__name__, tuple(canon(v) for v in value))
    if t is dict:
        return ("dict", tuple((canon(k), canon(v)) for k, v in value.items()))
    if dataclasses.is_dataclass(value):
        return ("dataclass", t.__qualname__, tuple(canon(getattr(value, f.name)) for f in dataclasses.fields(value)))
    return ("other", t.__qualname__, repr(value))


def same(a: Any, b: Any) -> bool:
    return canon(a) == canon(b)


def bag(records: Iterable[Any]) -> list[tuple]:
    """A multiset of records, as a sorted list of tokens."""
    return sorted(map(canon, records))


@dataclasses.dataclass
class Model:
    """Shards (lists, or iterators not read yet), and whether their placement is defined."""

    shards: list[Iterable[Any]]
    exact: bool = True
    in_input_order: bool = True

    def records(self) -> list[Any]:
        """Every record in (shard, position) order; reads the shards (once)."""
        return [r for shard in self.shards for r in shard]

    def materialize(self) -> list[list[Any]]:
        return [list(shard) for shard in self.shards]


def from_shards(shards: list[list[Any]]) -> Model:
    return Model([list(s) for s in shards])


# ---- per-item and per-shard ops: shard i -> shard i, lazily ------------------------------


def _per_shard(model: Model, fn: Callable[[Iterator[Any]], Iterable[Any]]) -> Model:
    """Shard i becomes `fn(iterator over shard i)`, unread until used."""
    return Model([fn(iter(shard)) for shard in model.shards], model.exact, model.in_input_order)


def map_(model, fn):
    return _per_shard(model, lambda it: (fn(r) for r in it))


def filter_(model, pred):
    return _per_shard(model, lambda it: (r for r in it if pred(r)))


def flat_map(model, fn):
    return _per_shard(model, lambda it: (y for r in it for y in fn(r)))


def select(model, *columns):
    """Keep the named keys of dict records, in this order; a non-dict record is an error."""

    def one(r):
        if not isinstance(r, dict):
            raise TypeError(f"select on a {type(r).__name__}")
        return {c: r[c] for c in columns if c in r}

    return map_(model, one)


class ShardInfo(NamedTuple):
    """What a two-parameter map_shard function gets besides the items: its shard and how many."""

    shard_idx: int
    total_shards: int


def map_shard(model, fn):
    """Shard i becomes `fn(items)`, or `fn(items, ShardInfo(i, number of shards))` when `fn`
    has two required positional parameters."""
    if _required_positional(fn) < 2:
        return _per_shard(model, fn)
    total = len(model.shards)
    return Model([fn(iter(shard), ShardInfo(i, total)) for i, shard in enumerate(model.shards)], model.exact,
                 model.in_input_order)


def _required_positional(fn) -> int:
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    return sum(1 for p in inspect.signature(fn).parameters.values() if p.kind in kinds and p.default is p.empty)


def window(model, size):
    """Consecutive lists of `size` per shard; the last one of a shard may be shorter."""

    def chunks(it):
        while chunk := list(itertools.islice(it, size)):
            yield chunk

    return _per_shard(model, chunks)


def window_by(model, folder, initial_state=None):
    """Per shard, lists of consecutive items: `folder(state, item) -> (stay, new_state)`, from
    `initial_state`; an item that does not stay closes the window, and opens the next one with
    the state `folder(initial_state, item)[1]`. (What a first item that does not stay does is
    not said: the test's folders keep every first item.)"""

    def windows(it):
        window, state = [], initial_state
        for item in it:
            stay, new_state = folder(state, item)
            if stay:
                window.append(item)
                state = new_state
                continue
            assert window, "a first item that does not stay: undocumented"
            yield window
            window, state = [item], folder(initial_state, item)[1]
        if window:
            yield window

    return _per_shard(model, windows)


def take_per_shard(model, n):
    return _per_shard(model, lambda it: itertools.islice(it, n))


def sorted_merge_join(model, right_shards, left_key, right_key, how="inner", combiner=None):
    """Shard i with right shard i: each left item, in order, with each equal-key right item, in
    order; with how="left" a left item without a match gives `combiner(left, None)`. The default
    combiner is `{**left, **right}`, and an unmatched left item as it is."""

    def combine(left, right):
        if combiner is not None:
            return combiner(left, right)
        if right is None:
            return left
        if not (isinstance(left, dict) and isinstance(right, dict)):
            raise TypeError("the default combiner merges dicts")
        return {**left, **right}

    def join(left_items, right_items):
        for left in left_items:
            matches = [r for r in right_items if left_key(left) == right_key(r)]
            yield from (combine(left, r) for r in matches)
            if not matches and how == "left":
                yield combine(left, None)

    assert len(right_shards) == len(model.shards)
    # a join's outputs take the origin of the last item it read ahead (docs): not modelled
    return Model([join(iter(shard), right) for shard, right in zip(model.shards, right_shards)], in_input_order=False)


# ---- shuffles: the records that come out, not where -------------------------------------


def _groups(records: list[Any], key) -> dict[tuple, tuple[Any, list[Any]]]:
    """Key token -> (the first item's key, the items in (shard, position) order)."""
    groups: dict[tuple, tuple[Any, list[Any]]] = {}
    for r in records:
        k = key(r)
        groups.setdefault(canon(k), (k, []))[1].append(r)
    return groups


def group_by(model, key, reducer, sort_by=None, num_output_shards=None, combiner=None):
    """`reducer(key, items)` per group, items ordered by `sort_by` then (shard, position). A
    generator function yields several records. A combiner (associative, pre-aggregating) must not
    change the result, so the model ignores it. Output: a bag over `num_output_shards`
    (default: as many as the input)."""
    out = []
    for k, items in _groups(model.records(), key).values():
        if sort_by is not None:
            items = sorted(items, key=sort_by)  # stable: ties stay in (shard, position) order
        result = reducer(k, iter(items))
        out.extend(result if inspect.isgeneratorfunction(reducer) else [result])  # anything else is one record
    return _bag(out, num_output_shards or len(model.shards), model.in_input_order and sort_by is None and combiner is None)


def deduplicate(model, key, num_output_shards=None):
    """The first record per key in `records()` order: the input's order where `in_input_order`."""
    firsts = [items[0] for _, items in _groups(model.records(), key).values()]
    return _bag(firsts, num_output_shards or len(model.shards), model.in_input_order)


def reshard(model, num_shards):
    return _bag(model.records(), num_shards, model.in_input_order)


def reduce(model, local, global_=None):
    """One shard with one value, `global(local(shard) for each non-empty shard)`; no value when
    every shard is empty."""
    final = global_ or local
    partials = [local(iter(shard)) for shard in model.materialize() if shard]
    return Model([[final(iter(partials))] if partials else []])


def count(model):
    n = len(model.records())
    return Model([[n] if n else []])


def _bag(records: list[Any], num_shards: int, in_input_order: bool) -> Model:
    """A bag: every record in shard 0 of the model, `num_shards` shards in all."""
    return Model([records] + [[] for _ in range(num_shards - 1)], exact=False, in_input_order=in_input_order)
