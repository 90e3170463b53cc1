"""`write_parquet` of Arrow rows: the row groups the record path writes, without the records.

The record path (`io/parquet.py`) cuts its records into batches of `ROWS_PER_BATCH` and writes
each as `pa.Table.from_pylist(batch, schema)`, where the schema is what exact inference
(`parquet_schema`) gives for every record so far. For rows already in Arrow whose columns are
of a type that inference maps one to one (strings, 8- to 64-bit integers, float32/64,
booleans, binary, all-null columns), that table is a cast of their own: a string column is
`str`, an integer column `int` (or `int!` beyond +-2**53), and so on, so the batch's
descriptor comes from the column types (and an integer column's min/max) instead of its
values. The same windows of `ROWS_PER_BATCH` rows, the same schemas, the same values: the
same bytes. Blocks of one window whose columns differ only in presence or in being all null
unite by name, first seen first, as their records' fields would. A window with anything else
(lists, structs, timestamps, unsigned 64-bit, one column of two types, a value that does not
fit) goes through its records, so it is written, or refused with the record path's error,
exactly as there.
"""

from __future__ import annotations

from collections.abc import Iterator

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from zephyr import counters
from zephyr.engine.frame import Frame, Pieces
from zephyr.io.files import atomic_write
from zephyr.io.parquet import ROWS_PER_BATCH, RowGroups
from zephyr.io.parquet_schema import SchemaConflict, arrow_schema, int_descriptor, unify

__all__ = ["write_parquet_pieces"]

_UNMAPPED = object()  # a column type inference does not map one to one


def write_parquet_pieces(pieces: Pieces, path: str, schema: pa.Schema | None = None, *, remove_stale: bool = False) -> int:
    """Write a batch-path stream to `path` as `write_parquet_file` writes its records."""
    writer = RowGroups(path, schema)
    with atomic_write(path, remove_stale=remove_stale) as raw, writer:
        for window in _windows(pieces.chunks(), ROWS_PER_BATCH):
            made = _record_table(window, writer)
            if made is None:
                counters.increment("zephyr/parquet_batches_as_records")
                writer.add_records(_records(window))
            else:
                writer.add_table(*made)
        writer.finish(raw)
    return writer.count


def _windows(chunks: Iterator[Frame | list], size: int) -> Iterator[list]:
    """The stream cut where the record path cuts it: lists of parts (a table slice, or
    records) of `size` rows each, the last one shorter."""
    parts: list = []
    rows = 0
    for piece in chunks:
        if isinstance(piece, Frame):
            table = piece.table()
            piece = table if table is not None else piece.records()
        start, n = 0, len(piece)
        while start < n:
            take = min(size - rows, n - start)
            parts.append(piece.slice(start, take) if isinstance(piece, pa.Table) else piece[start : start + take])
            rows += take
            start += take
            if rows == size:
                yield parts
                parts, rows = [], 0
    if parts:
        yield parts


def _records(window: list) -> list:
    return [record for part in window for record in (part.to_pylist() if isinstance(part, pa.Table) else part)]


def _record_table(window: list, writer: RowGroups) -> tuple[pa.Table, object] | None:
    """(the table the record path would write for this window, the writer's descriptor
    after it), or None where the window must go through its records."""
    if not all(isinstance(part, pa.Table) for part in window):
        return None
    if any(len(set(part.column_names)) != part.num_columns for part in window):
        return None
    try:  # blocks whose columns differ in nulls or presence unite as their records would: by name, first seen first
        table = pa.concat_tables(window, promote_options="default") if len(window) > 1 else window[0]
    except (pa.ArrowException, ValueError):  # one column of two types: the records' error, or their widening
        return None
    names = table.column_names
    if not names:
        return None
    fields = {}
    for name, column in zip(names, table.columns):
        desc = _descriptor(column)
        if desc is _UNMAPPED:
            return None
        fields[name] = desc
    try:
        if writer.schema is None:
            desc = unify(writer.desc, ("struct", fields), "")
            target = arrow_schema(desc)
        else:
            desc, target = None, writer.schema
            inferred = arrow_schema(("struct", fields))
            if not _fits(inferred, target):
                return None
    except SchemaConflict:  # the record path names the record and the field
        return None
    n = table.num_rows
    try:  # a cast that cannot be made (a large_string chunk of over 2 GiB into string) goes through records
        columns = [_cast(table.column(f.name), f.type, n) if f.name in fields else pa.nulls(n, f.type) for f in target]
        return pa.Table.from_arrays(columns, schema=target).combine_chunks(), desc
    except (pa.ArrowException, ValueError):
        return None


def _descriptor(column: pa.ChunkedArray):
    """What `parquet_schema` infers for the column's values, from its type."""
    kind = column.type
    if column.null_count == len(column):
        return None
    if pt.is_string(kind) or pt.is_large_string(kind):
        return "str"
    if pt.is_boolean(kind):
        return "bool"
    if pt.is_float32(kind) or pt.is_float64(kind):
        return "float"
    if pt.is_binary(kind) or pt.is_large_binary(kind):
        return "bytes"
    if pt.is_integer(kind):
        low, high = pc.min_max(column).values()
        return int_descriptor(low.as_py(), high.as_py(), "")
    return _UNMAPPED


def _fits(inferred: pa.Schema, schema: pa.Schema) -> bool:
    """The record path's fast case under a user's schema: every column of its own type (or
    all null) there, and nothing nullable turned required."""
    for field in inferred:
        index = schema.get_field_index(field.name)
        if index < 0 or (field.type != schema.field(index).type and field.type != pa.null()):
            return False
    return all(f.nullable for f in schema)


def _cast(column: pa.ChunkedArray, kind: pa.DataType, n: int):
    if column.type == kind:
        return column
    if column.null_count == n:
        return pa.nulls(n, kind)
    return column.cast(kind)
