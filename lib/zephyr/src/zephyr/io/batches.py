"""Parquet read as `pyarrow.RecordBatch` items (`load_parquet(batch_mode=True)`): for code that
works on columns, one row group per batch, the file path as a string column if asked."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from zephyr.io.load import iter_parquet_tables

__all__ = ["parquet_batches"]


def parquet_batches(
    path: str,
    columns: Sequence[str] | None,
    filter_expr: Any,
    row_groups: Sequence[int] | None,
    path_column: str | None,
) -> Iterator[Any]:
    """The row groups of `path` with rows left after `filter_expr`, projected to `columns` (in
    their order; the path column goes where `columns` names it, else last)."""
    import pyarrow as pa

    file_columns = None if columns is None else [c for c in columns if c != path_column]
    wanted = None if row_groups is None else set(row_groups)
    for table in iter_parquet_tables(path, file_columns, filter_expr, row_groups=wanted):
        if path_column is not None:
            table = table.append_column(pa.field(path_column, pa.string()), pa.array([path] * len(table), pa.string()))
            if columns is not None and path_column in columns:
                table = table.select([c for c in columns if c in table.column_names])
        yield from table.combine_chunks().to_batches()
