"""Parquet: row-batch streaming reader (projection, filter and row-group pushdown) and writer.

The reader hands the projection and the filter to `pyarrow.dataset`, which reads only the
column chunks it needs and skips the row groups whose min/max statistics rule the filter
out. It counts the bytes it asks the file for in the `zephyr/bytes_read` counter, so what
pushdown saves shows in every run's counters.
"""

from __future__ import annotations

import io
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from zephyr.io.files import atomic_write, url_to_fs

__all__ = ["read_parquet", "write_parquet_file"]

ROWS_PER_BATCH = 8192


class _CountingReader(io.RawIOBase):
    """A file wrapper that counts the bytes read through it (for `zephyr/bytes_read`)."""

    def __init__(self, raw):
        self._raw = raw
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)


def read_parquet(
    path: str,
    columns: Sequence[str] | None = None,
    filter: Any = None,
    row_groups: Sequence[int] | None = None,
) -> Iterator[dict[str, Any]]:
    """Yield the rows of a Parquet file as dicts; holds one row batch at a time.

    Args:
        columns: the columns to keep, in this order; names the file lacks are skipped.
        filter: a `zephyr.expr.Expr`; rows for which it is not true are dropped. It runs
            inside pyarrow (row groups excluded by statistics are never read) where pyarrow
            provably gives what Python gives for this file's schema (`zephyr.expr_arrow`);
            otherwise (a column the file lacks, integer arithmetic, mixed types, ...) it
            is evaluated on the rows in Python.
        row_groups: read only these row groups (a slice made by `approx_shard_bytes`).
    """
    import pyarrow.dataset as pads

    from zephyr import counters
    from zephyr.expr import referenced_columns
    from zephyr.expr_arrow import to_arrow_filter

    fs, fs_path = url_to_fs(path)
    # object stores: no read-ahead cache, so a skipped row group costs no bytes; pyarrow
    # coalesces the column chunks it does need into few ranged requests
    options = {} if isinstance(fs, (LocalFileSystem, MemoryFileSystem)) else {"cache_type": "none"}
    try:
        handle = fs.open(fs_path, "rb", **options)
    except FileNotFoundError as e:
        raise FileNotFoundError(f"Input file not found: {path}") from e
    reader = _CountingReader(handle)
    try:
        try:
            fragment = pads.ParquetFileFormat().make_fragment(reader)
            schema = fragment.physical_schema
        except Exception as e:
            raise ValueError(f"{path}: not a readable Parquet file: {e}") from e
        names = schema.names
        wanted = [c for c in columns if c in names] if columns is not None else None
        keep = wanted  # the output's columns; `wanted` may grow by the late filter's own
        pushed, late = None, None
        if filter is not None:
            pushed = to_arrow_filter(filter, schema)
            if pushed is None:  # pyarrow could differ from Python here: evaluate on the rows
                late = filter
                needed = referenced_columns(filter)
                wanted = wanted if wanted is None else wanted + sorted((needed & set(names)) - set(wanted))
        for batch in _row_group_batches(fragment, row_groups, wanted, pushed):
            rows = batch.to_pylist()
            if late is not None:
                rows = [_project(r, keep) for r in rows if late(r)]
            yield from rows
    finally:
        handle.close()
        counters.increment("zephyr/bytes_read", reader.bytes_read)


def _row_group_batches(fragment, row_groups: Sequence[int] | None, columns: list[str] | None, pushed: Any) -> Iterator[Any]:
    """Record batches of the wanted row groups, in file order, skipping those whose
    statistics rule `pushed` out (one fragment per row group: pyarrow may reorder a
    fragment's own row-group list)."""
    pieces = fragment.split_by_row_group(filter=pushed) if pushed is not None else fragment.split_by_row_group()
    if row_groups is not None:
        wanted = set(row_groups)
        pieces = [p for p in pieces if p.row_groups[0].id in wanted]
    for piece in sorted(pieces, key=lambda p: p.row_groups[0].id):
        yield from piece.to_batches(columns=columns, filter=pushed, batch_size=ROWS_PER_BATCH, use_threads=False)


def _project(row: dict, columns: list[str] | None) -> dict:
    return row if columns is None else {c: row[c] for c in columns if c in row}


def write_parquet_file(items: Iterable[dict[str, Any]], path: str, schema=None, *, remove_stale: bool = True) -> int:
    """Write dict rows to `path` atomically in batches; returns the number written.

    Without `schema` the first batch's inferred schema is used for the whole file.
    An empty input writes a valid file with `schema` (or no columns).
    """
    import pyarrow as pa
    import pyarrow.parquet as pq

    count = 0
    writer = None
    with atomic_write(path, remove_stale=remove_stale) as raw:
        try:
            for batch in _batches(items, ROWS_PER_BATCH):
                if schema is not None:
                    _check_columns(batch, schema, path, count)
                table = pa.Table.from_pylist(batch, schema=schema)
                if writer is None:
                    schema = table.schema
                    writer = pq.ParquetWriter(raw, schema)
                writer.write_table(table)
                count += len(batch)
            if writer is None:
                writer = pq.ParquetWriter(raw, schema if schema is not None else pa.schema([]))
        finally:
            if writer is not None:
                writer.close()
    return count


def _check_columns(batch: list[dict], schema, path: str, offset: int) -> None:
    """pyarrow drops keys that are not in the schema; refuse instead of losing data."""
    names = set(schema.names)
    for i, row in enumerate(batch):
        extra = [k for k in row if k not in names] if isinstance(row, dict) else []
        if extra:
            raise ValueError(
                f"{path}: record {offset + i} has column(s) {sorted(extra)} that are not in the Parquet schema "
                f"{schema.names} (taken from the first rows or given as schema=); pass a schema with every column"
            )


def _batches(items: Iterable[Any], size: int) -> Iterator[list[Any]]:
    batch: list[Any] = []
    for item in items:
        batch.append(item)
        if len(batch) >= size:
            yield batch
            batch = []
    if batch:
        yield batch
