"""Parquet: row-batch streaming reader and writer over pyarrow."""

from __future__ import annotations

from collections.abc import Iterable, Iterator, Sequence
from typing import Any

from zephyr.io.files import atomic_write, url_to_fs

__all__ = ["read_parquet", "write_parquet_file"]

ROWS_PER_BATCH = 8192


def read_parquet(path: str, columns: Sequence[str] | None = None) -> Iterator[dict[str, Any]]:
    """Yield each row of a Parquet file as a dict; holds one row batch at a time."""
    import pyarrow.parquet as pq

    fs, fs_path = url_to_fs(path)
    try:
        handle = fs.open(fs_path, "rb")
    except FileNotFoundError as e:
        raise FileNotFoundError(f"Input file not found: {path}") from e
    with handle:
        try:
            parquet = pq.ParquetFile(handle)
        except Exception as e:
            raise ValueError(f"{path}: not a readable Parquet file: {e}") from e
        for batch in parquet.iter_batches(batch_size=ROWS_PER_BATCH, columns=list(columns) if columns else None):
            yield from batch.to_pylist()


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
