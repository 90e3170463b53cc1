"""The engine's part of a stage: a loader and the column ops after it, on Frames.

A stage that starts with `load_jsonl()` (or `load_parquet()`) followed by column-expression ops
(`filter(col(...))`, `select`, `with_columns`, `map_batches`) reads its files into Frames
(`zephyr.engine.scan`), applies those ops in Polars where Polars provably computes what Python
computes (`zephyr.engine.translate`) and in Python on the frame's records where it does not,
and hands the frames on to a `write_jsonl` (their lines, `zephyr.engine.lines`), a
`write_parquet` or a shuffle keyed by a column. The first op that needs Python records (a
`map`, a Python `filter`, ...) gets them from the frames: the plan shows that switch as
`to_records` (`zephyr.plan.batch_span` decides where it is). Each op works on one piece at a
time (a Frame, or a list of records where a block's pieces already are records), so memory is
one block and what the ops make of it (`scan.block_bytes`). `ZEPHYR_COLUMNAR=0` turns the
engine off.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import polars as pl
import pyarrow as pa

from zephyr import counters
from zephyr.aggregate.grouped import PartialAggregate
from zephyr.engine.frame import Frame, Pieces, records_of
from zephyr.engine.lines import json_lines
from zephyr.engine.scan import block_bytes, frame_of_table, jsonl_frames
from zephyr.engine.translate import to_polars, to_polars_filter
from zephyr.expr import referenced_fields
from zephyr.expr.nodes import referenced_columns
from zephyr.expr.presence import record_has, schema_has, watched
from zephyr.io.batches import map_batches
from zephyr.io.files import open_output
from zephyr.io.json_records import line_bytes
from zephyr.io.jsonl import encode_records
from zephyr.io.parquet import read_parquet_pieces
from zephyr.plan import ops as op
from zephyr.plan.batch_span import batch_span
from zephyr.plan.ops import MapBatches, WithColumns, select_columns, watch_points
from zephyr.plan.sources import ParquetSlice, input_path_of, span_of

__all__ = ["load_batches", "map_batches_items", "map_batches_records", "records_table", "valid_rows", "write_jsonl_pieces"]


def load_batches(ops: tuple, items: Iterator[Any], sink: Any, memory: int | None) -> tuple[int, Pieces] | None:
    """(index of the first op left, the pieces the engine's ops made) or None (see `batch_span`)."""
    end = batch_span(ops, sink)
    if end is None:
        return None
    load = ops[0]
    whole = any(isinstance(o, MapBatches) for o in ops[1:end]) or (end < len(ops) and isinstance(ops[end], op.WriteParquet))
    needed = None if whole else frozenset(_needed_columns(ops[:end], sink))
    size = block_bytes(memory)
    pieces: Iterator = itertools.chain.from_iterable(_read(item, load, size, needed) for item in items)
    watches = watch_points(ops[1:end])  # columns no row had: counted, once per run of column ops
    for index, record in enumerate(ops[1:end]):
        if index in watches:
            pieces = watched(pieces, watches[index], _missing_in_piece)
        pieces = _each(_STEPS[type(record)], _argument(record), pieces)
    return end, Pieces(pieces)


def _missing_in_piece(piece: Frame | list, missing: set) -> tuple[set, bool]:
    """The paths of `missing` no row of `piece` has (`zephyr.expr.presence`), and whether it had rows."""
    if isinstance(piece, Frame) and piece.complete:
        schema = piece.df.to_arrow().schema if piece.df.width else None
        return {p for p in missing if schema is None or not schema_has(schema, p)}, len(piece) > 0
    if isinstance(piece, Frame):  # JSON rows: the records as read, unless a select dropped fields
        rows = piece.base if piece.selected is None and not piece.assigned else piece.records()
    else:
        rows = piece
    return {p for p in missing if not any(record_has(r, p) for r in rows)}, len(piece) > 0


def _needed_columns(ops: tuple, sink: Any) -> set[str]:
    """The input fields the engine's ops (and a shuffle's column key) read."""
    names: set[str] = set()
    for record in ops:
        if isinstance(record, op.FilterExpr):
            names |= referenced_columns(record.expr)
        elif isinstance(record, WithColumns):
            for _, expr in record.columns:
                names |= referenced_columns(expr)
        elif isinstance(record, (op.LoadJsonl, op.LoadParquet)) and record.filter is not None:
            names |= referenced_columns(record.filter)
        elif isinstance(record, PartialAggregate):
            for _, expr in record.keys + tuple((n, a.expr) for n, a in record.aggs if a.expr is not None):
                names |= referenced_columns(expr)
    key = getattr(getattr(sink, "partitioner", None), "key", None)
    expr = getattr(key, "expr", None)
    if expr is not None:
        names |= referenced_columns(expr)
    return names


def _read(item: Any, load: op.LoadJsonl | op.LoadParquet, size: int, needed: frozenset | None) -> Iterator[Frame | list]:
    path = input_path_of(item)
    if path is None:
        raise TypeError(f"load_* expects path strings as items, got {type(item).__name__}: {item!r:.100}")
    if isinstance(load, op.LoadJsonl):  # its folded ops apply here (the Parquet reader applies them itself)
        pieces: Iterator = jsonl_frames(path, load.on_bad_record, size, needed, span_of(item))
        if load.filter is not None:
            pieces = _each(_filter, load.filter, watched(pieces, referenced_fields(load.filter), _missing_in_piece))
        if load.columns is not None:
            pieces = _each(_select, load.columns, watched(pieces, {(c,) for c in load.columns}, _missing_in_piece))
        return pieces
    row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
    pieces = read_parquet_pieces(path, columns=load.columns, filter=load.filter, row_groups=row_groups)
    return (_python_filtered(piece) if isinstance(piece, list) else valid_rows(pa.Table.from_batches([piece])) for piece in pieces)


def _python_filtered(records: list) -> list:
    """Rows the Parquet reader filtered in Python (a pushed-down filter pyarrow could compute
    otherwise): records from here on, and the run says so."""
    counters.increment("zephyr/python_expressions")
    return records


def valid_rows(table: pa.Table) -> Frame | list:
    """A complete Frame of `table` when its rows hold what `to_pylist` would read; else its records.

    Tables from outside the JSON reader (a Parquet file, a `map_batches` fn) can hold strings
    that are not UTF-8 (Parquet readers don't check; `binary.view(string)` doesn't either), and
    types whose Python values Polars would read otherwise than pyarrow does (maps, time zones):
    such a table goes through `to_pylist`, which raises the record path's error or gives its
    records (counted as `zephyr/tables_as_records`)."""
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        counters.increment("zephyr/tables_as_records")
        return table.to_pylist()
    if not all(_plain_type(f.type) for f in table.schema) or len(set(table.column_names)) != table.num_columns:
        counters.increment("zephyr/tables_as_records")
        return table.to_pylist()
    return frame_of_table(table)


def _plain_type(kind: pa.DataType) -> bool:
    """Arrow types whose Python values Polars gives as pyarrow's `to_pylist` does."""
    t = pa.types
    if t.is_list(kind) or t.is_large_list(kind):
        return _plain_type(kind.value_type)
    if t.is_struct(kind):
        return all(_plain_type(kind.field(i).type) for i in range(kind.num_fields))
    return (t.is_string(kind) or t.is_large_string(kind) or t.is_integer(kind) or t.is_floating(kind) or t.is_boolean(kind)
            or t.is_binary(kind) or t.is_large_binary(kind) or t.is_null(kind))


def _each(step, argument, pieces: Iterator) -> Iterator:
    return (step(argument, piece) for piece in pieces)


def _argument(record) -> Any:
    if isinstance(record, op.FilterExpr):
        return record.expr
    if isinstance(record, op.Select):
        return record.columns
    return record


def _filter(expr, piece: Frame | list) -> Frame | list:
    if isinstance(piece, Frame):
        mask = to_polars_filter(expr, piece.schema())
        if mask is not None:
            return piece.filtered(_column(piece, mask))
        counters.increment("zephyr/python_expressions")
        return piece.filtered(pl.Series([expr(r) for r in piece.records()], dtype=pl.Boolean))
    return list(filter(expr, piece))


def _column(frame: Frame, expr: pl.Expr) -> pl.Series:
    """`expr` over the frame's rows (a literal too: one value per row)."""
    if not frame.df.width:  # no typed column, so only literals translated
        return pl.select(pl.repeat(expr, len(frame))).to_series()
    return frame.df.with_columns(expr.alias("__value")).get_column("__value")


def _select(columns: tuple[str, ...], piece: Frame | list) -> Frame | list:
    if isinstance(piece, Frame):
        return piece.selecting(columns)
    return [select_columns(record, columns) for record in piece]


def _with_columns(record: WithColumns, piece: Frame | list) -> Frame | list:
    if not isinstance(piece, Frame):
        return [record.apply_one(r) for r in piece]
    schema = piece.schema()
    values: dict[str, pl.Series | list] = {}
    python = []
    for name, expr in record.columns:
        made = to_polars(expr, schema)
        if made is None:
            python.append((name, expr))
        else:
            values[name] = _column(piece, made[0]).alias(name)
    if python:  # the columns Polars could compute otherwise, on the records as they come in (as the record path does)
        counters.increment("zephyr/python_expressions", len(python))
        rest = WithColumns(tuple(python))
        rows = [rest.apply_one(r) for r in piece.records()]
        values.update((name, [r[name] for r in rows]) for name, _ in python)
    return piece.with_values({name: values[name] for name, _ in record.columns})


def _map_batches(record: MapBatches, piece: Frame | list) -> Frame | list:
    table = piece.table() if isinstance(piece, Frame) else None
    table = table if table is not None else records_table(records_of(piece))
    return valid_rows(_called(record, table))


def records_table(records: list) -> pa.Table:
    """Records as a table with a column for every key any of them has (null where one lacks
    it), in order of first appearance: `Table.from_pylist` takes the first record's keys and
    silently drops a field the first record lacks."""
    names = dict.fromkeys(name for r in records if type(r) is dict for name in r)
    if not names or not all(type(r) is dict for r in records):
        return pa.Table.from_pylist(records)  # its error, its reading of dict subclasses, or no column
    return pa.Table.from_pydict({name: [r.get(name) for r in records] for name in names})


def _called(record: MapBatches, table: pa.Table) -> pa.Table:
    out = record.fn(table)
    if isinstance(out, pa.RecordBatch):
        out = pa.Table.from_batches([out])
    if not isinstance(out, pa.Table):
        raise TypeError(f"{record.describe()} must return a pyarrow.Table or RecordBatch, got {type(out).__name__}")
    return out


def _partial_aggregate(record: PartialAggregate, piece: Frame | list) -> list:
    """A block's partial rows, one per key (`zephyr.aggregate.grouped`): in Polars where the
    keys (strings, integers, booleans) and every aggregation's input translate, else in Python."""
    if not isinstance(piece, Frame):
        return record.partials(piece)
    made = _polars_partials(record, piece)
    if made is None:
        counters.increment("zephyr/python_expressions")
        return record.partials(piece.records())
    return made


def _polars_partials(record: PartialAggregate, frame: Frame) -> list | None:
    schema = frame.schema()
    keys = [to_polars(expr, schema) for _, expr in record.keys]
    if not frame.df.width or any(k is None or k[1] not in ("str", "int", "bool", "null") for k in keys):
        return None
    columns, widths = [], []
    for _, agg in record.aggs:
        value = (None, None) if agg.expr is None else to_polars(agg.expr, schema)
        parts = None if value is None else agg.polars(*value)
        if parts is None:
            return None
        columns += [part.alias(f"__a{len(columns) + i}") for i, part in enumerate(parts)]
        widths.append(len(parts))
    grouped = frame.df.group_by([k.alias(f"__k{i}") for i, (k, _) in enumerate(keys)], maintain_order=True).agg(columns)
    key_rows = zip(*(grouped.get_column(f"__k{i}").to_list() for i in range(len(keys))))
    state_rows = zip(*(grouped.get_column(f"__a{i}").to_list() for i in range(len(columns))))
    out = []
    for key, values in zip(key_rows, state_rows):
        states, at = [], 0
        for (_, agg), width in zip(record.aggs, widths):
            states.append(agg.state_of(values[at : at + width]))
            at += width
        out.append({"k": key[0] if len(key) == 1 else key, "s": states})
    return out


_STEPS = {op.FilterExpr: _filter, op.Select: _select, WithColumns: _with_columns, MapBatches: _map_batches,
          PartialAggregate: _partial_aggregate}


def map_batches_items(record: MapBatches, stream: Iterator[Any]) -> Iterator[Any]:
    """`map_batches` off the engine: RecordBatch items (`batch_mode`) map one by one to
    RecordBatches; dict records go `batch_size` at a time and come back as records."""
    stream = iter(stream)
    first = next(stream, _END)
    if first is _END:
        return
    if not isinstance(first, (dict, pa.RecordBatch)):
        raise TypeError(f"map_batches needs dict records or pyarrow.RecordBatch items (e.g. load_parquet(batch_mode=True)), "
                        f"got {type(first).__name__}: {first!r:.80}")
    stream = itertools.chain([first], stream)
    yield from map_batches(record.fn, stream) if isinstance(first, pa.RecordBatch) else map_batches_records(record, stream)


_END = object()


def map_batches_records(record: MapBatches, stream: Iterator[Any]) -> Iterator[Any]:
    """`map_batches` on the record path: `batch_size` records at a time as a pyarrow Table."""
    while window := list(itertools.islice(stream, record.batch_size)):
        yield from _called(record, records_table(window)).to_pylist()


def write_jsonl_pieces(pieces: Pieces, path: str) -> int:
    """Write pieces as JSON lines to `path` atomically: a frame's lines where the engine makes
    them (`zephyr.engine.lines`), else its records as `write_jsonl_file` writes them."""
    count = 0
    with open_output(path, remove_stale=False) as out:
        for piece in pieces.chunks():
            lines = json_lines(piece) if isinstance(piece, Frame) else None
            if lines is not None:
                out.write(line_bytes(lines))
                count += len(piece)
                continue
            records = records_of(piece)
            for start in range(0, len(records), 1024):
                chunk = records[start : start + 1024]
                out.write(encode_records(chunk, path, count))
                count += len(chunk)
    return count
