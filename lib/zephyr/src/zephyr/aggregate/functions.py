"""Per-key aggregations: what each computes, as partial states that merge across blocks and shards.

Each aggregation reads one expression per row (`count()` reads none) and keeps a small state per
key: a block of rows gives a partial state (in Python, or in Polars where the engine holds the
input typed), states of one key merge in input order (map-side combining, then the reduce), and
the last state gives the value. So a count over 10^9 records ships one partial row per key per
block, never the records.

Null rules are SQL's: `sum`, `min`, `max`, `mean` and `count(expr)` skip nulls (an all-null group
gives null, or 0 for a count); `first` and `collect` keep them. Values follow Python: a sum of ints
is exact at any size, `min`/`max` compare as Python does (values of kinds that do not compare are a
TypeError naming the aggregation). A float sum (and mean) adds a block's values, then the blocks'
sums in input order: deterministic for the same input and settings, and like every parallel engine
it may differ in the last bits from one sequential sum.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import polars as pl

from zephyr.expr.nodes import Aggregation, Column, Expr

__all__ = ["Agg", "as_agg", "collect", "count", "first", "max", "mean", "min", "sum"]

_builtin_sum, _builtin_min, _builtin_max = sum, min, max


@dataclass(frozen=True)
class Agg:
    """One aggregation of one expression (None: the rows themselves)."""

    expr: Any = field(default=None, compare=False)  # a zephyr.expr.Expr, or None
    text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "text", self.describe())

    def describe(self) -> str:
        return f"{type(self).__name__.lower()}({self.expr!r})" if self.expr is not None else f"{type(self).__name__.lower()}()"

    def partial(self, values: list) -> Any:
        """The state of a block's values of one key, in input order."""
        raise NotImplementedError

    def merge(self, states: list) -> Any:
        """States of one key, in input order, as one."""
        raise NotImplementedError

    def final(self, state: Any) -> Any:
        return state

    def polars(self, value: pl.Expr | None, kind: str | None) -> list[pl.Expr] | None:
        """The partial state in Polars, as columns (`state_of` makes them one state), for a value
        of `kind` ("str", "int", "float", "bool", "null"); None where Python must compute it."""
        return None

    def state_of(self, columns: tuple) -> Any:
        return columns[0]


def _present(values: list) -> list:
    return [v for v in values if v is not None]


def _numbers(values: list, agg: Agg) -> list:
    present = _present(values)
    for v in present:
        if type(v) not in (int, float, bool):
            raise TypeError(f"{agg.describe()} needs numbers, got {type(v).__name__} {v!r:.80}")
    return present


class Count(Agg):
    def partial(self, values: list) -> int:
        return len(values) if self.expr is None else len(_present(values))

    def merge(self, states: list) -> int:
        return _builtin_sum(states)

    def polars(self, value, kind):
        return [pl.len() if value is None else value.count()]


class Sum(Agg):
    def partial(self, values: list) -> Any:
        present = _numbers(values, self)
        return _builtin_sum(present) if present else None

    def merge(self, states: list) -> Any:
        present = _present(states)
        return _builtin_sum(present) if present else None

    def polars(self, value, kind):
        if kind == "int":  # Int128: no 64-bit overflow (a block holds far fewer than 2**64 rows)
            return [pl.when(value.count() > 0).then(value.cast(pl.Int128).sum())]
        if kind == "float":
            return [pl.when(value.count() > 0).then(value.sum())]
        return [pl.lit(None)] if kind == "null" else None


class Min(Agg):
    pick = staticmethod(_builtin_min)

    def partial(self, values: list) -> Any:
        present = _present(values)
        if not present:
            return None
        try:
            return self.pick(present)
        except TypeError as e:
            raise TypeError(f"{self.describe()}: {e}") from None

    def merge(self, states: list) -> Any:
        return self.partial(states)

    def polars(self, value, kind):
        # floats: Python's min/max of NaN depends on where the NaN is; strings compare by code point in both
        if kind in ("str", "int", "bool"):
            return [value.min()]
        return [pl.lit(None)] if kind == "null" else None


class Max(Min):
    pick = staticmethod(_builtin_max)

    def polars(self, value, kind):
        if kind in ("str", "int", "bool"):
            return [value.max()]
        return [pl.lit(None)] if kind == "null" else None


class Mean(Agg):
    def partial(self, values: list) -> list:
        present = _numbers(values, self)
        return [_builtin_sum(present) if present else 0, len(present)]

    def merge(self, states: list) -> list:
        return [_builtin_sum(s[0] for s in states), _builtin_sum(s[1] for s in states)]

    def final(self, state: list) -> Any:
        total, n = state
        return total / n if n else None

    def polars(self, value, kind):
        if kind not in ("int", "float"):
            return [pl.lit(0), pl.lit(0)] if kind == "null" else None
        return [value.cast(pl.Int128).sum() if kind == "int" else value.sum(), value.count()]

    def state_of(self, columns: tuple) -> list:
        return [columns[0], columns[1]]


class First(Agg):
    def partial(self, values: list) -> Any:
        return values[0]

    def merge(self, states: list) -> Any:
        return states[0]

    def polars(self, value, kind):
        return [value.first()] if kind is not None else None


class Collect(Agg):
    def partial(self, values: list) -> list:
        return list(values)

    def merge(self, states: list) -> list:
        return [v for s in states for v in s]

    def polars(self, value, kind):
        return [value.implode()] if kind in ("str", "int", "float", "bool", "null") else None


def _expr(value: Any) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, str) and value:
        return Column(value)
    raise TypeError(f"an aggregation reads a column name or a column expression, got {value!r:.80}")


def count(expr: Any = None) -> Agg:
    """Rows per key; `count("x")`: rows where `x` is not null."""
    return Count(None if expr is None else _expr(expr))


def sum(expr: Any) -> Agg:  # noqa: A001 - the aggregation's name (agg.sum), as in Polars
    """The sum of `expr` per key (nulls skipped; null when all are)."""
    return Sum(_expr(expr))


def min(expr: Any) -> Agg:  # noqa: A001
    """The least value of `expr` per key (nulls skipped)."""
    return Min(_expr(expr))


def max(expr: Any) -> Agg:  # noqa: A001
    """The greatest value of `expr` per key (nulls skipped)."""
    return Max(_expr(expr))


def mean(expr: Any) -> Agg:
    """The mean of `expr` per key (nulls skipped; null when all are)."""
    return Mean(_expr(expr))


def first(expr: Any) -> Agg:
    """The value of `expr` in the key's first row (by input shard, then position; nulls kept)."""
    return First(_expr(expr))


def collect(expr: Any) -> Agg:
    """The values of `expr` per key as a list, in input order (nulls kept)."""
    return Collect(_expr(expr))


_KINDS = {"count": Count, "sum": Sum, "min": Min, "max": Max, "mean": Mean, "first": First, "collect": Collect}


def as_agg(value: Any) -> Agg | None:
    """An aggregation (`agg.sum("x")`, or `col("x").sum()`), or None for anything else."""
    if isinstance(value, Agg):
        return value
    if isinstance(value, Aggregation):
        return _KINDS[value.kind](value.child)
    return None
