"""A block of a shard's rows inside the engine: typed Polars columns beside the rows' own JSON.

A `Frame` holds what the stage's column ops need as Polars columns of one type each (`df`),
and what the rows are: for JSON lines, each row's line as it was read (`lines`) and its record
as orjson parses it (`base`, parsed from the line when first asked for); for Parquet (or a
`map_batches` result), the whole row in `df` (`complete`). Column ops change `df` and note
which fields they set (`assigned`) or kept (`selected`); the rows' JSON and records are made from those only when something needs them
(`json_lines`, `records`), so a row that no op changed is written as the line it was read
from, byte for byte, and a field no op reads is never converted.

A column whose values in the block are not all of one kind (an int beside a str, a bool beside
an int, an int beyond 64 bits, a nested value) is kept as Python values (`untyped`): every
expression reading it runs in Python, and the counter `zephyr/python_columns/<name>` says so.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
import polars as pl
import pyarrow as pa

from zephyr import counters
from zephyr.io.jsonl import json_values

__all__ = ["PYTHON_COLUMN", "Frame", "Pieces", "typed_series", "records_of"]

PYTHON_COLUMN = "zephyr/python_columns/"  # + a column's name: blocks where it held values of several kinds

_INT64 = 2**63
_DTYPES = {str: pl.String, float: pl.Float64, bool: pl.Boolean}
_NONE = type(None)


def typed_series(name: str, values: list) -> pl.Series | None:
    """`values` as a Polars column that holds exactly those Python values, or None: one kind
    (str, int within 64 bits, float, bool) besides None, or all None. (Polars' own inference
    would take `True` into an int column as 1.)"""
    kinds = set(map(type, values))
    kinds.discard(_NONE)
    if not kinds:
        return pl.Series(name, values, dtype=pl.Null)
    if len(kinds) != 1:
        return None
    (kind,) = kinds
    if kind is int:
        try:
            return pl.Series(name, values, dtype=pl.Int64, strict=True)
        except (OverflowError, TypeError, pl.exceptions.PolarsError):  # beyond 64 bits
            return None
    dtype = _DTYPES.get(kind)
    return None if dtype is None else pl.Series(name, values, dtype=dtype, strict=True)


@dataclass
class Frame:
    """Rows of one block (see the module doc). `df` has one typed column per name it holds;
    `untyped` holds the same kind of column as Python values."""

    df: pl.DataFrame
    n: int  # rows (a frame may hold no typed column)
    lines: pa.Array | None = None  # each row's JSON line with its newline, as read (JSON input)
    parsed: list | None = None  # each row's record, once parsed from `lines` (see `base`)
    untyped: dict = field(default_factory=dict)  # name -> list of Python values
    assigned: tuple = ()  # fields set by with_columns, in order (a new one goes last in the record)
    selected: tuple | None = None  # the fields select kept, in order
    whole: bool = False  # `df` and `untyped` hold every field any row has (null where one lacks it)
    order: tuple = ()  # a whole frame's fields in record order (first seen first)
    where: str = ""  # the file (or span) the lines came from, and each row's line number in it:
    numbers: np.ndarray | None = None  # for naming a line orjson refuses when `base` parses it

    def __post_init__(self) -> None:
        if self.complete:
            self.whole = True
        if self.whole and not self.order:
            self.order = tuple(self.df.columns) + tuple(n for n in self.untyped if n not in self.df.columns)

    def __len__(self) -> int:
        return self.n

    @property
    def complete(self) -> bool:
        """Whether `df` (with `untyped`) is every field of every row."""
        return self.lines is None and self.parsed is None

    @property
    def base(self) -> list | None:
        """Each row's record as read (JSON input), parsed from its line by orjson on first use;
        None where `df` is the whole row."""
        if self.parsed is None and self.lines is not None:
            self.parsed = json_values(self.lines.to_pylist(), self.where, self.numbers)
        return self.parsed

    def schema(self) -> dict[str, Any]:
        return dict(self.df.schema)

    def values(self, name: str) -> list:
        """A column's Python values (a field missing from a record reads as None)."""
        if self.selected is not None and name not in self.selected:
            return [None] * len(self)
        if name in self.untyped:
            return self.untyped[name]
        if name in self.df.columns:
            return self.df.get_column(name).to_list()
        return [r.get(name) for r in self.base] if self.base is not None else [None] * len(self)

    def filtered(self, mask: pl.Series) -> Frame:
        """The rows where `mask` (booleans, no nulls) is true."""
        if mask.all():
            return self
        keep = mask.to_list()
        return replace(
            self,
            df=self.df.filter(mask) if self.df.width else self.df,
            n=sum(keep),
            lines=self.lines.filter(pa.array(keep)) if self.lines is not None else None,
            parsed=list(itertools.compress(self.parsed, keep)) if self.parsed is not None else None,
            numbers=self.numbers[np.asarray(keep, dtype=bool)] if self.numbers is not None else None,
            untyped={k: list(itertools.compress(v, keep)) for k, v in self.untyped.items()},
        )

    def with_values(self, columns: dict[str, pl.Series | list]) -> Frame:
        """Set fields (typed Series or Python lists), computed from the rows as they came in."""
        df, untyped = self.df, dict(self.untyped)
        typed = []
        for name, values in columns.items():
            series = values if isinstance(values, pl.Series) else typed_series(name, values)
            if series is None:
                counters.increment(PYTHON_COLUMN + name)
                untyped[name] = values
                df = df.drop(name, strict=False)
            else:
                untyped.pop(name, None)
                typed.append(series.alias(name))
        if typed:
            df = df.with_columns(typed) if df.width else pl.DataFrame(typed)  # a frame of no column has no height
        new = tuple(n for n in columns if n not in self.assigned)
        selected = None if self.selected is None else self.selected + tuple(n for n in columns if n not in self.selected)
        order = self.order + tuple(n for n in columns if n not in self.order) if self.whole else ()
        return replace(self, df=df, untyped=untyped, assigned=self.assigned + new, selected=selected, order=order)

    def selecting(self, names: tuple) -> Frame:
        """Keep only the fields `names` (a field a record lacks stays absent)."""
        kept = tuple(n for n in names if self.selected is None or n in self.selected)
        return replace(
            self,
            df=self.df.select([n for n in kept if n in self.df.columns]),
            untyped={n: v for n, v in self.untyped.items() if n in kept},
            selected=kept,
        )

    def records(self) -> list:
        """The rows as Python records: what the record path would have made of them."""
        if self.base is not None:
            records = self.base
        else:
            names = [n for n in self.order if n in self.df.columns or n in self.untyped]
            records = [dict(zip(names, row)) for row in zip(*(self.values(n) for n in names))] if names else [{} for _ in range(len(self))]
        if self.assigned and self.base is not None:
            columns = [(name, self.values(name)) for name in self.assigned]
            records = [_updated(r, [(name, values[i]) for name, values in columns]) for i, r in enumerate(records)]
        if self.selected is not None:
            records = [{k: r[k] for k in self.selected if k in r} for r in records]
        return records

    def table(self) -> pa.Table | None:
        """The rows as an Arrow table of typed columns (null for a field a row lacks), or None
        where the frame does not hold every field typed."""
        if not self.whole or self.untyped:
            return None
        names = [n for n in (self.order if self.selected is None else self.selected) if n in self.df.columns]
        return self.df.select(names).to_arrow(compat_level=pl.CompatLevel.oldest())


def _updated(record: dict, values: list) -> dict:
    out = dict(record)
    out.update(values)
    return out


def records_of(piece: Frame | list) -> list:
    return piece.records() if isinstance(piece, Frame) else piece


_first = operator.itemgetter(0)


class Pieces:
    """A shard's stream as pieces (`chunks()`: Frames, or lists of records), which iterates as
    Python records for any op that needs them: that is where a stage leaves the engine."""

    def __init__(self, pieces: Iterator[Frame | list]):
        self._pieces = pieces
        self._rows = 0  # rows of the pieces handed out by chunks()
        self._records: Iterator[Any] | None = None
        self._record_count: Iterator[int] | None = None
        self._failed = False  # an engine op raised: no record of the stream's is the one at fault

    def chunks(self) -> Iterator[Frame | list]:
        pieces = iter(self._pieces)
        while True:
            try:
                piece = next(pieces)
            except StopIteration:
                return
            except Exception:
                self._failed = True
                raise
            if len(piece):
                self._rows += len(piece)
                yield piece

    def __iter__(self) -> Iterator[Any]:
        if self._records is None:
            self._record_count = itertools.count()
            records = itertools.chain.from_iterable(map(records_of, self.chunks()))
            self._records = map(_first, zip(records, self._record_count))
        return self._records

    def __next__(self) -> Any:
        """Pieces is an iterator of records too, for ops (a `map_shard` function) that call `next`."""
        return next(iter(self))

    def counted(self) -> Iterator[int]:
        """An iterator whose next value is how many rows have been handed on so far (0 once an
        engine op failed, so that `failed_record` names none: the rows it was given are not
        the ones counted)."""
        return iter(lambda: 0 if self._failed else self._rows if self._record_count is None else next(self._record_count), None)
