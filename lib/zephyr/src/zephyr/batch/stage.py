"""Running the leading ops of a stage on Arrow batches, and where the plan switches to records.

`batch_span` decides how far a stage stays columnar: from a `load_jsonl()` or `load_parquet()`
(without the file path column; Parquet row batches are exact as they are) through the column-expression ops after it (`filter(col(...))`, `select`,
`with_columns`, `map_batches`). The batch path is taken only where something gains from it:
a column-expression op (or one pushdown folded into the loader), a `write_jsonl` right after, or a shuffle keyed by a column
(`deduplicate(col("text"))`, `group_by(col("k"), ...)`) or a `reshard`. Each op works on one
piece at a time (`rows.Rows`, or a list of records for a block read as records), so memory
is one block and what the ops make of it (`rows.block_bytes`).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import pyarrow as pa

from zephyr import ops as op
from zephyr.batch import enabled
from zephyr.batch.keys import is_column_key
from zephyr.batch.ops import MapBatches, WithColumns
from zephyr.batch.rows import Pieces, Rows, block_bytes, read_jsonl_pieces, records_of
from zephyr.expr_arrow import to_arrow_filter, to_arrow_value
from zephyr.readers import select_columns
from zephyr.sources import input_path_of

__all__ = ["batch_span", "load_batches", "map_batches_records", "plan_labels", "write_jsonl_pieces"]

_COLUMN_OPS = (op.FilterExpr, op.Select, WithColumns, MapBatches)
SWITCH_LABEL = "to_records"


def batch_span(ops: tuple, sink: Any) -> int | None:
    """How many leading ops run on batches (the index of the first op handed `Pieces`), or
    None when the stage runs on records from the start."""
    if not enabled() or not ops or not isinstance(ops[0], (op.LoadJsonl, op.LoadParquet)) or ops[0].include_file_paths:
        return None
    end = 1
    while end < len(ops) and isinstance(ops[end], _COLUMN_OPS):
        end += 1
    folded = ops[0].filter is not None or ops[0].columns is not None  # pushdown put column ops in the loader
    gains = end > 1 or folded or (end < len(ops) and isinstance(ops[end], op.WriteJsonl)) or (end == len(ops) and takes_batches(sink))
    return end if gains else None


def takes_batches(sink: Any) -> bool:
    """Whether a stage's sink takes Arrow rows as they are: a scatter keyed by a column, or a
    reshard."""
    from zephyr.scatter import HashPartition, RoundRobin, ScatterSink, keep_first

    if not isinstance(sink, ScatterSink):
        return False
    part = sink.partitioner
    if isinstance(part, RoundRobin):
        return True
    return isinstance(part, HashPartition) and is_column_key(part.key) and part.sort_by is None and part.combiner in (None, keep_first)


def plan_labels(ops: tuple, sink: Any, labels: list[str]) -> list[str]:
    """The ops' labels with the batch path shown: `[batches]` on the loader that reads Arrow
    batches, and `to_records` where records take over (before the sink, if it needs them)."""
    end = batch_span(ops, sink)
    if end is None:
        return labels
    labels = list(labels)
    labels[0] += " [batches]"
    switch = end + 1 if end < len(ops) and isinstance(ops[end], op.WriteJsonl) else end
    if switch < len(ops) or (switch == len(ops) and sink is not None and not takes_batches(sink)):
        labels.insert(switch, SWITCH_LABEL)
    return labels


def load_batches(ops: tuple, items: Iterator[Any], sink: Any, memory: int | None) -> tuple[int, Pieces] | None:
    """(index of the first op left, the pieces the batch-path ops made) or None (see `batch_span`)."""
    end = batch_span(ops, sink)
    if end is None:
        return None
    load = ops[0]
    size = block_bytes(memory)
    pieces: Iterator = itertools.chain.from_iterable(_read(item, load, size) for item in items)
    if isinstance(load, op.LoadJsonl):  # the Parquet reader applies them itself
        if load.filter is not None:
            pieces = _each(_filter, load.filter, pieces)
        if load.columns is not None:
            pieces = _each(_select, load.columns, pieces)
    for record in ops[1:end]:
        pieces = _each(_STEPS[type(record)], _argument(record), pieces)
    return end, Pieces(pieces)


def _read(item: Any, load: op.LoadJsonl | op.LoadParquet, size: int) -> Iterator[Rows | list]:
    path = input_path_of(item)
    if path is None:
        raise TypeError(f"load_* expects path strings as items, got {type(item).__name__}: {item!r:.100}")
    if isinstance(load, op.LoadJsonl):
        return read_jsonl_pieces(path, load.on_bad_record, size)
    from zephyr.io.parquet import read_parquet_pieces
    from zephyr.sources import ParquetSlice

    row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
    pieces = read_parquet_pieces(path, columns=load.columns, filter=load.filter, row_groups=row_groups)
    return (piece if isinstance(piece, list) else Rows(pa.Table.from_batches([piece])) for piece in pieces)


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
    return [record.apply(r) for r in records_of(piece)]


def _map_batches(record: MapBatches, piece: Rows | list) -> Rows:
    table = piece.table if isinstance(piece, Rows) else pa.Table.from_pylist(piece)
    return Rows(_called(record, table))


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


def map_batches_records(record: MapBatches, stream: Iterator[Any]) -> Iterator[Any]:
    """`map_batches` on the record path: `batch_size` records at a time as a pyarrow Table."""
    while window := list(itertools.islice(stream, record.batch_size)):
        yield from _called(record, pa.Table.from_pylist(window)).to_pylist()


def write_jsonl_pieces(pieces: Pieces, path: str) -> int:
    """Write pieces as JSON lines to `path` atomically (Arrow rows without Python records where
    their types allow; the same bytes `write_jsonl_file` writes for their records)."""
    from zephyr.io.files import open_output
    from zephyr.io.jsonl import encode_records
    from zephyr.json_records import line_bytes

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
