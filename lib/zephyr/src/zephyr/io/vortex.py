"""Vortex files (the `vortex-data` package): a row reader with projection and filter pushdown, and
an atomic writer.

Reading opens a local file natively and any other fsspec path through a Python file object.
A filter goes into Vortex's scan only where its result provably equals Python's: a conjunction
(`&`) of comparisons between a column and a literal of one kind (`zephyr.expr.arrow` checks
the kinds against the file's schema) of integer or boolean columns, in a file without struct
columns. Anything else (`|`, `~`, `is_null`, nested fields, arithmetic, strings, which Vortex
stores as views; floats, which it orders totally: NaN above every number and equal to itself,
-0.0 apart from 0.0; any filter on a file with a struct column, which vortex-data 0.93 fails
to scan) is evaluated on the rows in Python, since Vortex's own answers differ there (it finds
no rows for `is_null` on an all-null column).

Writing converts the records exactly as `write_parquet_file` does (the same schema
inference, widening and refusals), through a local temporary Parquet file, then streams that
file's row groups into Vortex: memory holds one batch, not the shard.
"""

from __future__ import annotations

import contextlib
import os
import shutil
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from zephyr.errors import InputNotFoundError
from zephyr.io.files import atomic_write, url_to_fs
from zephyr.io.temporaries import make_temp_file
from zephyr.expr import Column, Compare, Literal, Logical, referenced_columns
from zephyr.expr.arrow import to_arrow_filter
from zephyr.expr.presence import note_missing_from_file
from zephyr.io.parquet import write_parquet_file
from zephyr.io.records import UnwritableRecordError

__all__ = ["read_vortex", "read_vortex_schema", "write_vortex_file"]

# not floats: Vortex orders them totally (NaN above every number and equal to itself, -0.0 apart
# from 0.0), where Python's comparisons are false for NaN and 0.0 == -0.0
_PUSHABLE_TYPES = ("int8", "int16", "int32", "int64", "bool")


def read_vortex(
    path: str,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    row_start: int | None = None,
    row_end: int | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the rows of a Vortex file as dicts, holding one batch at a time.

    Args:
        columns: the columns to keep, in this order; names the file lacks are skipped.
        filter: a `zephyr.expr.Expr`; rows for which it is not true are dropped.
        row_start, row_end: only rows [row_start, row_end) of the file (before filtering).
    """
    import pyarrow as pa


    with _opened(path) as vortex_file:
        dataset = vortex_file.to_dataset()
        names = dataset.schema.names
        if not names:  # an empty file written without a schema
            return
        note_missing_from_file(dataset.schema, columns, filter)  # the planner checked the first file's
        keep = [c for c in columns if c in names] if columns is not None else None
        ranged = row_start is not None or row_end is not None
        pushed = None if filter is None or ranged else _pushable(filter, dataset.schema)
        late = filter if filter is not None and pushed is None else None
        read = keep
        if late is not None and keep is not None:
            read = keep + sorted((referenced_columns(late) & set(names)) - set(keep))
        if ranged:
            total = dataset.count_rows()  # a range past the end reads what there is, as a slice does
            start, end = min(row_start or 0, total), total if row_end is None else min(row_end, total)
            indices = pa.array(range(start, max(start, end)), pa.uint64())
            batches = dataset.take(indices, columns=read).to_batches()
        else:
            batches = dataset.to_batches(columns=read, filter=pushed)
        for batch in batches:
            rows = batch.to_pylist()
            if late is not None:
                rows = [r if read == keep else {c: r[c] for c in keep} for r in rows if late(r)]
            yield from rows


def read_vortex_schema(path: str) -> Any:
    """The `pyarrow.Schema` of a Vortex file (an empty file written without one has no columns)."""
    with _opened(path) as vortex_file:
        return vortex_file.to_dataset().schema


@contextlib.contextmanager
def _opened(path: str) -> Iterator[Any]:
    import vortex  # a compiled library: imported when a Vortex file is read
    from fsspec.implementations.local import LocalFileSystem

    fs, fs_path = url_to_fs(path)
    if not fs.exists(fs_path):
        raise InputNotFoundError(f"Input file not found: {path}")
    with contextlib.ExitStack() as stack:
        try:
            if isinstance(fs, LocalFileSystem):
                opened = vortex.open(fs_path)
            else:
                opened = vortex.open_readable(stack.enter_context(fs.open(fs_path, "rb")))
        except Exception as e:
            raise ValueError(f"{path}: not a readable Vortex file: {str(e).split(chr(10))[0]}") from e
        yield opened


def _pushable(expr: Any, schema: Any) -> Any:
    """`expr` as a filter Vortex evaluates exactly as Python does, or None (see the module docstring)."""
    import pyarrow as pa

    if any(pa.types.is_struct(schema.field(i).type) for i in range(len(schema.names))):
        return None  # vortex-data 0.93 fails a filter on a column after a struct column ("Couldn't find the y field")

    def simple(node: Any) -> bool:
        if isinstance(node, Logical):
            return node.op == "&" and simple(node.left) and simple(node.right)
        if not isinstance(node, Compare):
            return False
        column, literal = (node.left, node.right) if isinstance(node.left, Column) else (node.right, node.left)
        return (isinstance(column, Column) and isinstance(literal, Literal) and column.name in schema.names
                and str(schema.field(column.name).type) in _PUSHABLE_TYPES)

    return to_arrow_filter(expr, schema) if simple(expr) else None


def write_vortex_file(items: Iterable[dict[str, Any]], path: str, schema: Any = None, *, remove_stale: bool = True) -> int:
    """Write dict rows (or dataclasses) to `path` atomically as a Vortex file; returns how many.

    Types, widening and refusals are those of `zephyr.io.parquet.write_parquet_file` (an
    UnwritableRecordError names the record and field, and no file appears). An empty input
    writes a valid file with `schema` (or no columns).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq
    import vortex


    staged, encoded = make_temp_file("segment"), make_temp_file("segment")
    try:
        try:
            count = write_parquet_file(items, staged, schema, remove_stale=False)
        except UnwritableRecordError as e:  # name the output, not the staging file
            raise UnwritableRecordError(path, e.record, e.field, e.reason) from None
        parquet = pq.ParquetFile(staged)
        batches = (parquet.read_row_group(g).combine_chunks().to_batches() for g in range(parquet.num_row_groups))
        reader = pa.RecordBatchReader.from_batches(parquet.schema_arrow, (b for group in batches for b in group))
        vortex.io.write(reader, encoded)
        with atomic_write(path, remove_stale=remove_stale) as raw, open(encoded, "rb") as source:
            shutil.copyfileobj(source, raw, 1 << 20)
    finally:
        for temporary in (staged, encoded):
            with contextlib.suppress(FileNotFoundError):
                os.remove(temporary)
    return count
