"""A shard's records replayed in Python through its leading column ops, one record at a time.

To name the record a failure hit, whatever ran the ops: a filter folded into a Parquet or JSON
Lines reader, Arrow batches (`zephyr.execution.batch_stage`), or Python records. The loader's
folded filter and projection and the column ops that follow it (`filter(<expression>)`,
`select`, `with_columns`) are evaluated here as the record path evaluates them, which every
engine must agree with; the input is read again as the loader reads it before its folded ops
(`loaders.numbered_records`: each record with its index in the shard, and `path:line` for JSON
Lines). A `map_batches` function is user code and is not run again: no steps cross it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from zephyr.execution.loaders import numbered_records, shape_one
from zephyr.plan import ops as op
from zephyr.plan.ops import select_columns

__all__ = ["Numbered", "column_prefix", "column_steps", "first_raising", "numbered", "nth_through"]

_DROPPED = object()

Step = Callable[[Any, "Numbered"], Any]  # (record, where it came from) -> the record out, or _DROPPED


@dataclass(frozen=True)
class Numbered:
    """A record of the shard's input: its index there, `path:line` (JSON Lines), its file."""

    index: int
    where: str | None
    path: str | None
    record: Any


def numbered(ops: tuple, items: Iterator[Any]) -> Iterator[Numbered]:
    """The shard's input as the stage's loader (`ops[0]`, if it is one) reads it before its
    folded filter and projection; `items` are the shard's items (paths, or records)."""
    load = ops[0] if ops and isinstance(ops[0], op.LOAD_OPS) else None
    if load is None:
        return (Numbered(i, None, None, record) for i, record in enumerate(items))
    read = (entry for item in items for entry in numbered_records(item, load))
    return (Numbered(i, where, path, record) for i, (where, path, record) in enumerate(read))


def column_prefix(ops: tuple) -> int:
    """The index of the first op after the loader and the column ops that directly follow it."""
    end = 1 if ops and isinstance(ops[0], op.LOAD_OPS) else 0
    while end < len(ops) and isinstance(ops[end], op.EXPRESSION_OPS):
        end += 1
    return end


def column_steps(ops: tuple, end: int) -> list[Step] | None:
    """Per-record steps doing what `ops[:end]` do, or None when one of them cannot be replayed."""
    steps: list[Step] = []
    for index, record in enumerate(ops[:end]):
        if index == 0 and isinstance(record, op.LOAD_OPS):
            steps.extend(_loader_steps(record))
        elif isinstance(record, op.FilterExpr):
            steps.append(lambda r, _, expr=record.expr: r if expr(r) else _DROPPED)
        elif isinstance(record, op.Select):
            steps.append(lambda r, _, columns=record.columns: select_columns(r, columns))
        elif isinstance(record, op.WithColumns):
            steps.append(lambda r, _, with_columns=record: with_columns.apply_one(r))
        else:
            return None  # a map_batches fn: user code, not run again
    return steps


def _loader_steps(load: Any) -> list[Step]:
    if getattr(load, "batch_mode", False):
        return []  # `numbered` gives its batches as they are
    steps: list[Step] = []
    if load.filter is not None:
        steps.append(lambda r, _: r if load.filter(r) else _DROPPED)
    if load.columns is not None or load.include_file_paths:
        steps.append(lambda r, at: shape_one(r, at.path, load))
    return steps


def first_raising(records: Iterator[Numbered], steps: list[Step], error_type: type) -> tuple[Numbered, Any] | None:
    """The first record on which a step raises `error_type`, with the record as that step got
    it; None if none does, or another error comes first."""
    for entry in records:
        record = entry.record
        for step in steps:
            try:
                out = step(record, entry)
            except error_type:
                return entry, record
            except Exception:  # noqa: BLE001 - another failure first: not the one to name
                return None
            if out is _DROPPED:
                break
            record = out
    return None


def nth_through(records: Iterator[Numbered], steps: list[Step], n: int) -> tuple[Numbered, Any] | None:
    """The `n`-th record (from 0) to come through every step, and what the steps made of it."""
    count = 0
    for entry in records:
        record = entry.record
        for step in steps:
            record = step(record, entry)
            if record is _DROPPED:
                break
        else:
            if count == n:
                return entry, record
            count += 1
    return None
