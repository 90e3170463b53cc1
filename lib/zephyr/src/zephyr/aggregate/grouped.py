"""`group_by(key).agg(...)`: per-key aggregations with partial aggregation on the map side.

    from zephyr import agg, col
    ds.group_by("domain").agg(docs=agg.count(), tokens=agg.sum("tokens"), first_url=agg.first("url"))
    ds.group_by(["lang", "domain"]).count()

The plan is a per-item op that turns each block of rows into one partial row per key
(`PartialAggregate`: in Polars on the engine's frames where the key and inputs are typed, else in
Python), then a `group_by` on the key whose combiner merges partial rows on the map side and whose
reducer merges them and writes one record per key: the key columns, then each aggregation's
value, in the order given. Partial rows are small dicts (`{"k": key, "s": [state, ...]}`), so
they cross the shuffle as JSON lines. Keys follow the shuffle's rule (`1`, `1.0` and `True` are
three keys; NaN is one; null is a key).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from zephyr.aggregate.functions import Agg, Count, as_agg, count
from zephyr.aggregate.functions import max as max_agg
from zephyr.aggregate.functions import mean as mean_agg
from zephyr.aggregate.functions import min as min_agg
from zephyr.aggregate.functions import sum as sum_agg
from zephyr.expr.nodes import Column, Expr
from zephyr.shuffle.keys import key_bytes

__all__ = ["GroupedDataset", "MergePartials", "PartialAggregate", "FinalAggregate"]

ROWS_PER_PARTIAL = 65536  # records a partial row sums up at most, off the engine


@dataclass(frozen=True)
class PartialAggregate:
    """Per-item op: each block of rows (a frame, or up to ROWS_PER_PARTIAL records) becomes one
    partial row per key, keys in order of first appearance."""

    keys: tuple  # ((name, Expr), ...)
    aggs: tuple  # ((name, Agg), ...)
    text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", self.describe())

    def describe(self) -> str:
        keys = ", ".join(repr(e) for _, e in self.keys)
        return f"partial_agg([{keys}], {', '.join(f'{n}={a.describe()}' for n, a in self.aggs)})"

    def key_of(self, record: Any) -> Any:
        if not isinstance(record, dict):
            raise TypeError(f"group_by(...).agg() needs dict records, got {type(record).__name__}: {record!r:.80}")
        values = tuple(e.evaluate(record) for _, e in self.keys)
        return values[0] if len(values) == 1 else values

    def apply(self, stream: Iterator) -> Iterator:
        stream = iter(stream)
        while records := list(itertools.islice(stream, ROWS_PER_PARTIAL)):
            yield from self.partials(records)

    def partials(self, records: list) -> list[dict]:
        """One partial row per key of `records`, in Python."""
        groups: dict[bytes, tuple[Any, list]] = {}
        for record in records:
            key = self.key_of(record)
            groups.setdefault(key_bytes(key), (key, []))[1].append(record)
        out = []
        for key, rows in groups.values():
            states = [a.partial(rows if isinstance(a, Count) and a.expr is None else [a.expr.evaluate(r) for r in rows])
                      for _, a in self.aggs]
            out.append({"k": key, "s": states})
        return out


def partial_key(row: dict) -> Any:
    """The key of a partial row."""
    return row["k"]


@dataclass(frozen=True)
class MergePartials:
    """The map-side combiner: partial rows of one key as one."""

    aggs: tuple

    def __call__(self, key: Any, rows: Iterator[dict]) -> dict:
        rows = list(rows)
        if len(rows) == 1:
            return rows[0]
        return {"k": key, "s": [a.merge([r["s"][i] for r in rows]) for i, (_, a) in enumerate(self.aggs)]}


@dataclass(frozen=True)
class FinalAggregate:
    """The reducer: a key's partial rows as its output record."""

    key_names: tuple
    aggs: tuple

    def __call__(self, key: Any, rows: Iterator[dict]) -> dict:
        merged = MergePartials(self.aggs)(key, rows)
        keys = (key,) if len(self.key_names) == 1 else key
        record = dict(zip(self.key_names, keys))
        record.update((name, a.final(state)) for (name, a), state in zip(self.aggs, merged["s"]))
        return record


class GroupedDataset:
    """`Dataset.group_by(key)` without a reducer: call `agg(...)` (or a shortcut) on it."""

    def __init__(self, dataset: Any, keys: tuple, num_output_shards: int | None):
        self._dataset = dataset
        self._keys = keys
        self._shards = num_output_shards

    def agg(self, **aggs: Agg) -> Any:
        """One record per key: the key columns, then `name=aggregation` values in the order given.

        >>> ds.group_by("domain").agg(docs=agg.count(), chars=agg.sum(col("text").str_len()))
        """
        if not aggs:
            raise TypeError("agg() needs at least one name=aggregation, e.g. agg(docs=zephyr.agg.count())")
        made = {}
        for name, value in aggs.items():
            made[name] = as_agg(value)
            if made[name] is None:
                raise TypeError(f"agg({name}=...) needs an aggregation (zephyr.agg.count(), agg.sum('x'), col('x').max(), ...), "
                                f"got {value!r:.80}")
        aggs = made
        clash = set(aggs) & {name for name, _ in self._keys}
        if clash:
            raise ValueError(f"agg() names {sorted(clash)} are also key columns; choose other names")
        pairs = tuple(aggs.items())
        partial = PartialAggregate(self._keys, pairs)
        names = tuple(name for name, _ in self._keys)
        return self._dataset._then(partial).group_by(
            partial_key, FinalAggregate(names, pairs), combiner=MergePartials(pairs), num_output_shards=self._shards)

    def count(self) -> Any:
        """`{key columns..., "count": rows}` per key."""
        return self.agg(count=count())

    def sum(self, column: Any) -> Any:
        """`{key columns..., "sum_<column>": sum}` per key."""
        return self.agg(**{f"sum_{_name(column)}": sum_agg(column)})

    def mean(self, column: Any) -> Any:
        return self.agg(**{f"mean_{_name(column)}": mean_agg(column)})

    def min(self, column: Any) -> Any:
        return self.agg(**{f"min_{_name(column)}": min_agg(column)})

    def max(self, column: Any) -> Any:
        return self.agg(**{f"max_{_name(column)}": max_agg(column)})


def _name(column: Any) -> str:
    if isinstance(column, str):
        return column
    if isinstance(column, Column):
        return column.name
    raise TypeError(f"a shortcut aggregation takes a column name; use agg(name=...) for {column!r:.80}")


def group_keys(key: Any) -> tuple | None:
    """`group_by`'s key as ((output name, expression), ...), when it names columns: "domain",
    col("domain"), or a list of them; None for a key function."""
    items = key if isinstance(key, (list, tuple)) else [key]
    out = []
    for item in items:
        if isinstance(item, str) and item:
            out.append((item, Column(item)))
        elif isinstance(item, Column):
            out.append((item.name, item))
        elif isinstance(item, Expr):
            out.append(("key" if len(items) == 1 else f"key{len(out)}", item))
        else:
            return None
    return tuple(out) if out else None
