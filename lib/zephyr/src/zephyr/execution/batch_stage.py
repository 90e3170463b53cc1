"""The batch path: stage ops written with column expressions run on Arrow record batches.

A stage that starts with `load_jsonl()` (or `load_parquet()`) followed by column-expression ops
(`filter(col(...))`, `select`, `with_columns`, `map_batches`) reads its files into pyarrow
tables a block of lines at a time (`zephyr.io.arrow_rows`), applies those ops with
pyarrow.compute here, and hands the batches on as they are to a `write_jsonl`
(`zephyr.io.arrow_json` writes each row's JSON line without a Python record) or to a shuffle
keyed by a column (`zephyr.shuffle.arrow_keys`: key bytes and hashes in Arrow). The first op
that needs Python records (a `map`, a Python `filter`, ...) gets them from the batches: the
plan shows that switch as `to_records` (`zephyr.plan.batch_span` decides where it is).

Everything here is exact: a block goes columnar only when its Arrow table, written back as
JSON lines, gives the block's bytes exactly (so the table holds what `read_jsonl` would have
read, and the output is what the record path writes); an expression goes to pyarrow only where
`zephyr.expr.arrow` proves it agrees with Python. Anything else runs on records, block by
block. Each op works on one piece at a time (`Rows`, or a list of records for a block read as
records), so memory is one block and what the ops make of it (`arrow_rows.block_bytes`).
`ZEPHYR_COLUMNAR=0` turns the batch path off.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from zephyr.expr import referenced_fields
from zephyr.expr.arrow import to_arrow_filter, to_arrow_value
from zephyr.expr.presence import record_has, schema_has, watched
from zephyr.io.arrow_rows import Pieces, Rows, block_bytes, read_jsonl_pieces, records_of, valid_rows
from zephyr.io.batches import map_batches
from zephyr.io.files import open_output
from zephyr.io.json_records import line_bytes
from zephyr.io.jsonl import encode_records
from zephyr.io.parquet import read_parquet_pieces
from zephyr.plan import ops as op
from zephyr.plan.batch_span import batch_span
from zephyr.plan.ops import MapBatches, WithColumns, select_columns, watch_points
from zephyr.plan.sources import ParquetSlice, input_path_of

__all__ = ["load_batches", "map_batches_items", "map_batches_records", "write_jsonl_pieces"]


def load_batches(ops: tuple, items: Iterator[Any], sink: Any, memory: int | None) -> tuple[int, Pieces] | None:
    """(index of the first op left, the pieces the batch-path ops made) or None (see `batch_span`)."""
    end = batch_span(ops, sink)
    if end is None:
        return None
    load = ops[0]
    size = block_bytes(memory)
    pieces: Iterator = itertools.chain.from_iterable(_read(item, load, size) for item in items)
    watches = watch_points(ops[1:end])  # columns no row had: counted, once per run of column ops
    for index, record in enumerate(ops[1:end]):
        if index in watches:
            pieces = _watched(pieces, watches[index])
        pieces = _each(_STEPS[type(record)], _argument(record), pieces)
    return end, Pieces(pieces)


def _watched(pieces: Iterator, paths: set) -> Iterator:
    """`pieces`, the columns an op reads watched (`zephyr.expr.presence`): a column no row of the
    shard (for a loader's folded ops: of the file, as on the record path) had is counted."""
    return watched(pieces, paths, _missing_in_piece)


def _missing_in_piece(piece: Rows | list, missing: set) -> tuple[set, bool]:
    if isinstance(piece, Rows):
        return {p for p in missing if not schema_has(piece.table.schema, p)}, len(piece) > 0
    return {p for p in missing if not any(record_has(r, p) for r in piece)}, len(piece) > 0


def _read(item: Any, load: op.LoadJsonl | op.LoadParquet, size: int) -> Iterator[Rows | list]:
    path = input_path_of(item)
    if path is None:
        raise TypeError(f"load_* expects path strings as items, got {type(item).__name__}: {item!r:.100}")
    if isinstance(load, op.LoadJsonl):  # its folded ops apply here (the Parquet reader applies them itself)
        pieces = read_jsonl_pieces(path, load.on_bad_record, size)
        if load.filter is not None:
            pieces = _each(_filter, load.filter, _watched(pieces, referenced_fields(load.filter)))
        if load.columns is not None:
            pieces = _each(_select, load.columns, _watched(pieces, {(c,) for c in load.columns}))
        return pieces
    row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
    pieces = read_parquet_pieces(path, columns=load.columns, filter=load.filter, row_groups=row_groups)
    return (piece if isinstance(piece, list) else valid_rows(pa.Table.from_batches([piece])) for piece in pieces)


def _each(step, argument, pieces: Iterator) -> Iterator:
    return (step(argument, piece) for piece in pieces)


def _argument(record) -> Any:
    if isinstance(record, op.FilterExpr):
        return record.expr
    if isinstance(record, op.Select):
        return record.columns
    return record


def _filter(expr, piece: Rows | list) -> Rows | list:
    if isinstance(piece, Rows):
        arrow = to_arrow_filter(expr, piece.table.schema)
        if arrow is not None:
            mask = _project(piece.table, [arrow], ["mask"]).column(0)
            lines = piece.lines.filter(mask.combine_chunks()) if piece.lines is not None else None
            return Rows(piece.table.filter(mask), lines, piece.plain)
    return list(filter(expr, records_of(piece)))


def _select(columns: tuple[str, ...], piece: Rows | list) -> Rows | list:
    if isinstance(piece, Rows):
        names = [c for c in columns if c in piece.table.column_names]
        if names:
            return Rows(piece.table.select(names), None, piece.plain)
    return [select_columns(record, columns) for record in records_of(piece)]


def _with_columns(record: WithColumns, piece: Rows | list) -> Rows | list:
    if isinstance(piece, Rows):
        schema = piece.table.schema
        arrows = [to_arrow_value(expr, schema) for _, expr in record.columns]
        if all(a is not None for a in arrows):
            names = [name for name, _ in record.columns]
            values = _project(piece.table, arrows, [f"v{i}" for i in range(len(arrows))])
            table = piece.table
            for name, column in zip(names, values.columns):
                at = table.schema.get_field_index(name)
                table = table.set_column(at, name, column) if at >= 0 else table.append_column(name, column)
            plain = piece.plain and not any(pa.types.is_string(c.type) or pa.types.is_large_string(c.type) for c in values.columns)
            return Rows(table, None, plain)
    return [record.apply_one(r) for r in records_of(piece)]


def _map_batches(record: MapBatches, piece: Rows | list) -> Rows | list:
    table = piece.table if isinstance(piece, Rows) else records_table(piece)
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


_STEPS = {op.FilterExpr: _filter, op.Select: _select, WithColumns: _with_columns, MapBatches: _map_batches}


def _project(table: pa.Table, expressions: list, names: list[str]) -> pa.Table:
    import pyarrow.acero as ac

    source = ac.Declaration("table_source", ac.TableSourceNodeOptions(table))
    project = ac.Declaration("project", ac.ProjectNodeOptions(expressions, names))
    return ac.Declaration.from_sequence([source, project]).to_table(use_threads=False)


def map_batches_items(record: MapBatches, stream: Iterator[Any]) -> Iterator[Any]:
    """`map_batches` off the batch path: RecordBatch items (`batch_mode`) map one by one to
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
    """Write pieces as JSON lines to `path` atomically (Arrow rows without Python records where
    their types allow; the same bytes `write_jsonl_file` writes for their records)."""
    count = 0
    with open_output(path, remove_stale=False) as out:
        for piece in pieces.chunks():
            lines = piece.json_lines() if isinstance(piece, Rows) else None
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
