"""Reading a path item into records: what a shard task does for load_jsonl/load_parquet/load_vortex/load_warc/load_file.

A loader op carries what pushdown folded into it (a projection and a filter, see
`zephyr.plan.pushdown`) and the file path column. Parquet gets both inside pyarrow (the filter
where it provably agrees with Python, see `zephyr.expr.arrow`); JSON Lines applies them to
each record, in the same order: filter, then the file path, then projection. An
`InputFileSpec` item brings its own row range, filter and columns (`zephyr.io.load`).
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from zephyr.expr import referenced_fields
from zephyr.expr.presence import watched
from zephyr.io.batches import parquet_batches
from zephyr.io.formats import FileFormat, format_for
from zephyr.io.jsonl import read_jsonl, read_jsonl_numbered, span_label
from zephyr.io.load import InputFileSpec, load_file
from zephyr.io.parquet import read_parquet
from zephyr.io.vortex import read_vortex
from zephyr.io.warc import read_warc
from zephyr.plan import ops as op
from zephyr.plan.ops import select_columns
from zephyr.plan.sources import ParquetSlice, input_path_of, span_of

__all__ = ["numbered_records", "read_path", "shape_one"]


def read_path(item: Any, load: op.LoadOp) -> Iterator[Any]:
    """Records of one path item (a path, a slice of a Parquet file, a span of bytes) as `load` asks."""
    if isinstance(item, InputFileSpec):
        return _read_spec(item, load)
    path = input_path_of(item)
    if path is None:
        raise TypeError(f"load_* expects path strings or InputFileSpec as items, got {type(item).__name__}: {item!r:.100}")
    fmt = op.fixed_format(load) or format_for(path)
    path_column = load.file_path_column if load.include_file_paths else None
    if getattr(load, "batch_mode", False):
        row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
        return parquet_batches(path, load.columns, load.filter, row_groups, path_column)
    if fmt in (FileFormat.JSONL, FileFormat.WARC):
        reader = read_jsonl if fmt is FileFormat.JSONL else read_warc
        records = reader(path, on_bad_record=load.on_bad_record, span=span_of(item))
        return _shaped(_folded(records, load), path, path_column, load.columns)
    file_columns = None if load.columns is None else [c for c in load.columns if c != path_column]
    if fmt is FileFormat.VORTEX:
        records = read_vortex(path, file_columns, load.filter)
    else:
        row_groups = item.row_groups if isinstance(item, ParquetSlice) else None
        records = read_parquet(path, columns=file_columns, filter=load.filter, row_groups=row_groups)
    if path_column is None:
        return records
    # pyarrow already projected; only the file path column still needs its place
    return _shaped(records, path, path_column, _columns_naming(load.columns, path_column))


def _columns_naming(columns: tuple[str, ...] | None, path_column: str) -> tuple[str, ...] | None:
    """A projection still to apply after a reader projected: only one that places the path column."""
    return columns if columns and path_column in columns else None


def _read_spec(spec: InputFileSpec, load: op.LoadOp) -> Iterator[Any]:
    """Records of an `InputFileSpec` item: the spec's own range, filter and columns, then `load`'s."""
    fixed = op.fixed_format(load)
    records = load_file(spec if fixed is None else replace(spec, format=fixed.value))
    return _shaped(_folded(records, load), spec.path, load.file_path_column if load.include_file_paths else None, load.columns)


def _folded(records: Iterator[Any], load: op.LoadOp) -> Iterator[Any]:
    """`load`'s folded filter applied to records read in Python, each column they read watched
    (`zephyr.expr.presence`: a column no record of the file had is counted), the projection's too."""
    if load.filter is not None:
        records = filter(load.filter, watched(records, referenced_fields(load.filter)))
    if load.columns is not None:
        path_column = load.file_path_column if load.include_file_paths else None
        records = watched(records, {(c,) for c in load.columns if c != path_column})
    return records


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


def numbered_records(item: Any, load: op.LoadOp) -> Iterator[tuple[str | None, str | None, Any]]:
    """(where, file, record) for what `read_path` reads from `item` before `load`'s folded filter
    and projection (`where` is `path:line` for JSON Lines, else None): the input again, for
    naming the record a failure hit (`zephyr.execution.replay`). A `batch_mode` loader's
    batches as they are."""
    path = item.path if isinstance(item, InputFileSpec) else input_path_of(item)
    if getattr(load, "batch_mode", False):
        return ((None, path, batch) for batch in read_path(item, load))
    raw = replace(load, filter=None, columns=None, include_file_paths=False)
    jsonl = path is not None and not isinstance(item, InputFileSpec) and (op.fixed_format(load) or format_for(path)) is FileFormat.JSONL
    if jsonl:
        span = span_of(item)
        where = span_label(path, span)
        return ((f"{where}:{line}", path, record) for line, record in read_jsonl_numbered(path, load.on_bad_record, span))
    return ((None, path, record) for record in read_path(item, raw))


def shape_one(record: Any, path: str | None, load: op.LoadOp) -> Any:
    """One record as `load` shapes it after its filter: the file path column, then the projection."""
    path_column = load.file_path_column if load.include_file_paths else None
    return next(_shaped(iter([record]), path, path_column, load.columns))
