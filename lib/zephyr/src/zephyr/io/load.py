"""Plain loader functions, for `flat_map` and for code written against the reference project:

    from zephyr.readers import InputFileSpec, load_file
    Dataset.from_files("in/*.parquet").flat_map(load_file)
    load_parquet(InputFileSpec(path, columns=["id"], row_start=10, row_end=20, filter_expr=col("x") > 0))

Each takes a path or an `InputFileSpec` (one file: its columns, a row range, a filter) and
yields dict records, holding one batch at a time. The Dataset loaders (`.load_file()`, ...)
read the same way and add pushdown across ops; these are for use inside your own functions.
The order of operations is the same everywhere: the row range first, then the filter, then
the projection. Parquet is read with `pyarrow.parquet.ParquetFile` alone, never
`pyarrow.dataset`, one row group at a time.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from zephyr.io.formats import DEFAULT_FILE_PATH_COLUMN
from functools import reduce
from zephyr.expr import col
from zephyr.expr import referenced_columns
from zephyr.expr.arrow import to_arrow_filter
from zephyr.io.files import open_raw_input
from zephyr.io.formats import FileFormat, format_for
from zephyr.io.jsonl import read_jsonl
from zephyr.io.vortex import read_vortex
from zephyr.io.warc import read_warc

__all__ = [
    "DEFAULT_FILE_PATH_COLUMN",
    "InputFileSpec",
    "iter_parquet_row_groups",
    "iter_parquet_tables",
    "load_file",
    "load_jsonl",
    "load_parquet",
    "load_vortex",
    "load_warc",
]

_FORMATS = ("auto", "parquet", "jsonl", "vortex", "warc")


@dataclass
class InputFileSpec:
    """One file to read: which `format` ("auto" tells by extension), which `columns` (None: all),
    which rows [`row_start`, `row_end`) counted before filtering, and a `filter_expr` (a
    `zephyr.expr.Expr`) rows must satisfy."""

    path: str
    format: str = "auto"
    columns: list[str] | None = None
    row_start: int | None = None
    row_end: int | None = None
    filter_expr: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.path, str) or not self.path:
            raise ValueError(f"InputFileSpec path must be a non-empty string, got {self.path!r}")
        if self.format not in _FORMATS:
            raise ValueError(f"InputFileSpec format must be one of {_FORMATS}, got {self.format!r}")
        for name in ("row_start", "row_end"):
            value = getattr(self, name)
            if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 0):
                raise ValueError(f"InputFileSpec {name} must be a non-negative integer or None, got {value!r}")
        if self.row_start is not None and self.row_end is not None and self.row_end < self.row_start:
            raise ValueError(f"InputFileSpec row_end ({self.row_end}) is before row_start ({self.row_start}) for {self.path}")


def as_spec(source: str | InputFileSpec) -> InputFileSpec:
    if isinstance(source, InputFileSpec):
        return source
    if isinstance(source, str):
        return InputFileSpec(source)
    raise TypeError(f"expected a path or an InputFileSpec, got {type(source).__name__}: {source!r:.100}")


def load_jsonl(source: str | InputFileSpec) -> Iterator[dict]:
    """The records of a JSON Lines file (compression by extension), as `Dataset.load_jsonl()` reads them."""
    spec = as_spec(source)
    return _ranged(read_jsonl(spec.path), spec)


def load_parquet(source: str | InputFileSpec) -> Iterator[dict]:
    """The rows of a Parquet file as dicts (see `iter_parquet_tables`)."""
    spec = as_spec(source)
    for table in iter_parquet_tables(spec.path, spec.columns, spec.filter_expr, spec.row_start, spec.row_end):
        yield from table.to_pylist()


def load_vortex(source: str | InputFileSpec) -> Iterator[dict]:
    """The rows of a Vortex file as dicts (`zephyr.io.vortex.read_vortex`)."""
    spec = as_spec(source)
    return read_vortex(spec.path, spec.columns, spec.filter_expr, spec.row_start, spec.row_end)


def load_warc(source: str | InputFileSpec) -> Iterator[dict]:
    """The response and conversion records of a WARC or WET file (`zephyr.io.warc.read_warc`)."""
    spec = as_spec(source)
    return _ranged(read_warc(spec.path), spec)


def _ranged(records: Iterator[dict], spec: InputFileSpec) -> Iterator[dict]:
    """A record reader's records as `spec` asks: its row range, then its filter, then its columns."""
    if spec.row_start is not None or spec.row_end is not None:
        records = itertools.islice(records, spec.row_start or 0, spec.row_end)
    if spec.filter_expr is not None:
        records = filter(spec.filter_expr, records)
    if spec.columns is not None:
        columns = tuple(spec.columns)
        records = ({c: r[c] for c in columns if c in r} for r in records)
    return records


def load_file(source: str | InputFileSpec) -> Iterator[dict]:
    """The records of a file, its format told by `spec.format` or else by its extension.

    Raises:
        ValueError: "Unsupported extension: ..." for a name no format claims.
    """
    spec = as_spec(source)
    fmt = FileFormat(spec.format) if spec.format != "auto" else format_for(spec.path)
    loaders = {FileFormat.JSONL: load_jsonl, FileFormat.PARQUET: load_parquet, FileFormat.VORTEX: load_vortex, FileFormat.WARC: load_warc}
    loader = loaders[fmt]
    return loader(spec)


def iter_parquet_tables(
    path: Any,
    columns: Sequence[str] | None = None,
    filter_expr: Any = None,
    row_start: int | None = None,
    row_end: int | None = None,
    row_groups: Sequence[int] | None = None,
    skip: Any = None,
) -> Iterator[Any]:
    """One `pyarrow.Table` per row group of a Parquet file (of `row_groups` only, if given, and
    not those `skip(group)` rules out) that has rows left after the row range and the filter;
    columns the file lacks are skipped. The filter runs in pyarrow where
    it provably gives Python's result for the file's schema (`zephyr.expr.arrow`), else on the
    rows in Python."""
    import pyarrow as pa
    import pyarrow.parquet as pq


    with _parquet_file(path) as parquet:
        schema = parquet.schema_arrow
        keep = [c for c in columns if c in schema.names] if columns is not None else None
        pushed = to_arrow_filter(filter_expr, schema) if filter_expr is not None else None
        read = keep
        if filter_expr is not None and keep is not None:
            read = keep + sorted((referenced_columns(filter_expr) & set(schema.names)) - set(keep))
        first = 0
        for group in range(parquet.num_row_groups):
            rows = parquet.metadata.row_group(group).num_rows
            lo, hi = max(first, row_start or 0), min(first + rows, first + rows if row_end is None else row_end)
            first += rows
            if (row_groups is not None and group not in row_groups) or (skip is not None and skip(group)):
                continue
            if hi <= lo:
                if row_end is not None and first >= row_end:
                    break
                continue
            table = parquet.read_row_group(group, columns=read)
            if hi - lo < rows:
                table = table.slice(lo - (first - rows), hi - lo)
            if pushed is not None:
                table = table.filter(pushed)
            elif filter_expr is not None:
                table = table.filter(pa.array([filter_expr(r) for r in table.to_pylist()], pa.bool_()))
            if read != keep:
                table = table.select(keep)
            if len(table):
                yield table


@contextlib.contextmanager
def _parquet_file(source: Any) -> Iterator[Any]:
    """A `pyarrow.parquet.ParquetFile` over a path (any fsspec URL), or `source` itself if it is one."""
    import pyarrow.parquet as pq


    if isinstance(source, pq.ParquetFile):
        yield source
        return
    with open_raw_input(source) as handle:
        yield pq.ParquetFile(handle)


def iter_parquet_row_groups(
    source: Any,
    *,
    columns: Sequence[str] | None = None,
    row_start: int | None = None,
    row_end: int | None = None,
    equality_predicates: dict[str, Any] | None = None,
) -> Iterator[Any]:
    """One `pyarrow.Table` per row group with rows where every `equality_predicates` column
    equals its value (as the reference project's function): a row group whose min/max
    statistics exclude a value is not read. `source` is a path or a `ParquetFile`."""

    predicates = dict(equality_predicates or {})
    condition = reduce(lambda a, b: a & b, (col(c) == v for c, v in predicates.items())) if predicates else None
    with _parquet_file(source) as parquet:
        def ruled_out(group: int) -> bool:
            meta = parquet.metadata.row_group(group)
            for i in range(meta.num_columns):
                chunk = meta.column(i)
                stats = chunk.statistics
                value = predicates.get(chunk.path_in_schema, _ABSENT)
                if value is not _ABSENT and stats is not None and stats.has_min_max and _outside(value, stats):
                    return True
            return False

        yield from iter_parquet_tables(parquet, columns, condition, row_start, row_end, skip=ruled_out if predicates else None)


_ABSENT = object()


def _outside(value: Any, stats: Any) -> bool:
    try:
        return bool(value < stats.min or value > stats.max)
    except TypeError:  # not comparable with the column's type: read the group and let the filter decide
        return False
