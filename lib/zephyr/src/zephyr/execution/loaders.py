"""Reading a path item into records: what a shard task does for load_jsonl/load_parquet/load_file.

A loader op carries what pushdown folded into it (a projection and a filter, see
`zephyr.plan.pushdown`) and the file path column. Parquet gets both inside pyarrow (the filter
where it provably agrees with Python, see `zephyr.expr.arrow`); JSON Lines applies them to
each record, in the same order: filter, then the file path, then projection.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

from zephyr.plan import ops as op
from zephyr.io.formats import FileFormat, format_for
from zephyr.io.jsonl import read_jsonl
from zephyr.io.parquet import read_parquet
from zephyr.plan.ops import select_columns
from zephyr.plan.sources import ParquetSlice, input_path_of

__all__ = ["read_path"]


def read_path(item: Any, load: op.LoadJsonl | op.LoadParquet | op.LoadFile) -> Iterator[Any]:
    """Records of one path item (a path, or a slice of a Parquet file) as `load` asks."""
    path = input_path_of(item)
    if path is None:
        raise TypeError(f"load_* expects path strings as items, got {type(item).__name__}: {item!r:.100}")
    fmt = FileFormat.JSONL if isinstance(load, op.LoadJsonl) else FileFormat.PARQUET if isinstance(load, op.LoadParquet) else format_for(path)
    path_column = load.file_path_column if load.include_file_paths else None
    if fmt is FileFormat.JSONL:
        records = read_jsonl(path, on_bad_record=load.on_bad_record)
        if load.filter is not None:
            records = filter(load.filter, records)
        return _shaped(records, path, path_column, load.columns)
    row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
    file_columns = None if load.columns is None else [c for c in load.columns if c != path_column]
    records = read_parquet(path, columns=file_columns, filter=load.filter, row_groups=row_groups)
    if path_column is None:
        return records
    # pyarrow already projected; only the file path column still needs its place
    return _shaped(records, path, path_column, load.columns if load.columns and path_column in load.columns else None)


def _shaped(records: Iterator[Any], path: str, path_column: str | None, columns: tuple[str, ...] | None) -> Iterator[Any]:
    """Add the file path column (where a projection names it, else last) and project."""
    if path_column is None and columns is None:
        return records  # nothing to reshape: no generator frame per record
    return _reshaped(records, path, path_column, columns)


def _reshaped(records: Iterator[Any], path: str, path_column: str | None, columns: tuple[str, ...] | None) -> Iterator[Any]:
    last = path_column is not None and (columns is None or path_column not in columns)
    for record in records:
        if path_column is not None and not last:
            record = _with_path(record, path, path_column)
        if columns is not None:
            record = select_columns(record, columns)
        if last:
            record = _with_path(record, path, path_column)
        yield record


def _with_path(record: Any, path: str, column: str) -> dict:
    if not isinstance(record, dict):
        raise TypeError(f"include_file_paths needs dict records, got {type(record).__name__} in {path}")
    return {**record, column: path}
