"""Parquet read as `pyarrow.RecordBatch` items (`load_parquet(batch_mode=True)`): for code that
works on columns, one row group per batch, the file path as a string column if asked."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any

from zephyr.io.load import iter_parquet_tables
from zephyr.naming import callable_name

__all__ = ["map_batches", "parquet_batches"]


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


def map_batches(fn: Any, batches: Iterator[Any]) -> Iterator[Any]:
    """`fn(batch)` for each `pyarrow.RecordBatch` item; `fn` returns one RecordBatch (a Table is
    combined into one). Anything else in or out is a TypeError naming it."""
    import pyarrow as pa


    for batch in batches:
        if not isinstance(batch, pa.RecordBatch):
            raise TypeError(f"map_batches needs pyarrow.RecordBatch items (e.g. load_parquet(batch_mode=True)), "
                            f"got {type(batch).__name__}: {batch!r:.80}")
        out = fn(batch)
        if isinstance(out, pa.Table):
            out = out.combine_chunks().to_batches()[0] if out.num_rows else pa.RecordBatch.from_pylist([], schema=out.schema)
        if not isinstance(out, pa.RecordBatch):
            raise TypeError(f"map_batches fn {callable_name(fn)} must return a pyarrow.RecordBatch, got {type(out).__name__}")
        yield out
