"""Op records: what a Dataset asks for, as frozen data. How they run lives in `shard.py`.

Per-item ops (everything in `StreamOp`) transform one shard's stream and fuse into a single
stage; shuffle ops (`ShuffleOp`, see `zephyr.plan.shuffle_ops`) cut a stage boundary.
"""

from __future__ import annotations

import itertools
import string
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any, Union

from zephyr.expr.nodes import referenced_fields
from zephyr.io.formats import DEFAULT_FILE_PATH_COLUMN, FileFormat
from zephyr.naming import callable_name
from zephyr.tasks import ShardInfo
from zephyr.io.compression import strip_compression_suffix
from zephyr.io.tokens import offsets_path

__all__ = [
    "DEFAULT_FILE_PATH_COLUMN",
    "EXPRESSION_OPS",
    "LOAD_OPS",
    "fixed_format",
    "WRITE_OPS",
    "FilterExpr",
    "FlatMap",
    "Filter",
    "LoadFile",
    "LoadWarc",
    "LoadJsonl",
    "LoadOp",
    "LoadParquet",
    "LoadVortex",
    "Map",
    "MapBatches",
    "MapShard",
    "Select",
    "ShardInfo",
    "StreamOp",
    "TakePerShard",
    "Window",
    "WindowBy",
    "WithColumns",
    "WriteBinary",
    "WriteJsonl",
    "WriteParquet",
    "WriteOp",
    "WriteVortex",
    "WriteTokens",
    "callable_name",
    "check_columns",
    "input_basename",
    "loader_reads_source",
    "shard_output_path",
    "validate_output_pattern",
    "watch_points",
]




@dataclass(frozen=True)
class Map:
    fn: Callable[[Any], Any]

    def apply(self, stream: Iterator) -> Iterator:
        return map(self.fn, stream)

    def describe(self) -> str:
        return f"map({callable_name(self.fn)})"


@dataclass(frozen=True)
class MapBatches:
    """`fn` over batches of rows. `pyarrow.RecordBatch` items (`load_parquet(batch_mode=True)`)
    are handed to `fn` one by one and its batches are the items out; dict records are handed
    over `batch_size` at a time as a `pyarrow.Table` (on the batch path: an input block as it
    is) and the rows `fn` returns are the records out."""

    fn: Callable[[Any], Any]
    batch_size: int = 4096

    def describe(self) -> str:
        return f"map_batches({callable_name(self.fn)})"


@dataclass(frozen=True)
class WithColumns:
    """Set columns to expression values, all computed from the record as it comes in: an
    existing column keeps its place, a new one goes last (in the order given)."""

    columns: tuple = field(compare=False)  # ((name, zephyr.expr.Expr), ...)
    columns_text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns_text", self.describe())

    def describe(self) -> str:
        return f"with_columns({', '.join(f'{name}={expr!r}' for name, expr in self.columns)})"

    def apply(self, stream: Iterator) -> Iterator:
        return map(self.apply_one, stream)

    def reads(self) -> set[tuple[str, ...]]:
        """The column paths its expressions read (`zephyr.expr.presence`)."""
        return set().union(*(referenced_fields(expr) for _, expr in self.columns))

    def apply_one(self, record: Any) -> dict:
        if not isinstance(record, dict):
            raise TypeError(f"{self.describe()} needs dict records, got {type(record).__name__}: {record!r:.80}")
        out = dict(record)
        out.update([(name, expr.evaluate(record)) for name, expr in self.columns])
        return out


@dataclass(frozen=True)
class Filter:
    predicate: Callable[[Any], bool]

    def apply(self, stream: Iterator) -> Iterator:
        return filter(self.predicate, stream)

    def describe(self) -> str:
        return f"filter({callable_name(self.predicate)})"


@dataclass(frozen=True)
class FlatMap:
    fn: Callable[[Any], Any]

    def apply(self, stream: Iterator) -> Iterator:
        return itertools.chain.from_iterable(map(self.fn, stream))

    def describe(self) -> str:
        return f"flat_map({callable_name(self.fn)})"


@dataclass(frozen=True)
class FilterExpr:
    """A filter given as a column expression: printable, and pushed into Parquet reads.

    Records compare by the expression's text (`==` on an expression builds an expression)."""

    expr: Any = field(compare=False)  # a zephyr.expr.Expr
    expr_text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expr_text", repr(self.expr))

    def apply(self, stream: Iterator) -> Iterator:
        return filter(self.expr, stream)

    def reads(self) -> set[tuple[str, ...]]:
        """The column paths its expression reads (`zephyr.expr.presence`)."""
        return referenced_fields(self.expr)

    def describe(self) -> str:
        return f"filter({self.expr!r})"


@dataclass(frozen=True)
class Select:
    columns: tuple[str, ...]

    def apply(self, stream: Iterator) -> Iterator:
        return (select_columns(item, self.columns) for item in stream)

    def reads(self) -> set[tuple[str, ...]]:
        return {(c,) for c in self.columns}

    def describe(self) -> str:
        return f"select({', '.join(repr(c) for c in self.columns)})"


@dataclass(frozen=True)
class MapShard:
    fn: Callable[..., Any]
    with_info: bool = False  # fn(items, ShardInfo) rather than fn(items)

    def describe(self) -> str:
        return f"map_shard({callable_name(self.fn)})"


@dataclass(frozen=True)
class Window:
    size: int

    def describe(self) -> str:
        return f"window({self.size})"


@dataclass(frozen=True)
class WindowBy:
    folder_fn: Callable[[Any, Any], tuple[bool, Any]]
    initial_state: Any = None

    def describe(self) -> str:
        return f"window_by({callable_name(self.folder_fn)})"


@dataclass(frozen=True)
class TakePerShard:
    n: int

    def describe(self) -> str:
        return f"take_per_shard({self.n})"


@dataclass(frozen=True)
class _Load:
    """What every loader shares: the file path column, and what pushdown folded in."""

    include_file_paths: bool = False
    file_path_column: str = DEFAULT_FILE_PATH_COLUMN
    columns: tuple[str, ...] | None = None  # select() folded in (in that order); None: all
    filter: Any = field(default=None, compare=False)  # a zephyr.expr.Expr folded in, applied before `columns`
    filter_text: str | None = field(default=None, init=False, repr=False)  # what loaders compare by

    def __post_init__(self) -> None:
        object.__setattr__(self, "filter_text", None if self.filter is None else repr(self.filter))

    def reads(self) -> set[tuple[str, ...]]:
        """The column paths its folded filter and projection read from the file (the path column is its own)."""
        paths = referenced_fields(self.filter) if self.filter is not None else set()
        path_column = self.file_path_column if self.include_file_paths else None
        return paths | {(c,) for c in self.columns or () if c != path_column}

    def _extras(self) -> list[str]:
        extras = []
        if self.include_file_paths:
            extras.append("include_file_paths=True")
            if self.file_path_column != DEFAULT_FILE_PATH_COLUMN:
                extras.append(f"file_path_column={self.file_path_column!r}")
        if self.columns is not None:
            extras.append(f"columns={list(self.columns)!r}")
        if self.filter is not None:
            extras.append(f"filter={self.filter!r}")
        return extras


def _sizing_extras(load: Any) -> list[str]:
    return [f"approx_shard_bytes={load.approx_shard_bytes}"] if load.approx_shard_bytes else []


@dataclass(frozen=True)
class LoadJsonl(_Load):
    on_bad_record: str = "raise"
    approx_shard_bytes: int | None = None  # shards sized by bytes (`zephyr.plan.sizing`)

    def describe(self) -> str:
        extras = [f"on_bad_record={self.on_bad_record!r}"] if self.on_bad_record != "raise" else []
        return f"load_jsonl({', '.join(_sizing_extras(self) + extras + self._extras())})"


@dataclass(frozen=True)
class LoadParquet(_Load):
    approx_shard_bytes: int | None = None
    batch_mode: bool = False  # yield pyarrow.RecordBatch items (a row group each) instead of dicts

    def describe(self) -> str:
        extras = ["batch_mode=True"] if self.batch_mode else []
        return f"load_parquet({', '.join(_sizing_extras(self) + extras + self._extras())})"


@dataclass(frozen=True)
class LoadVortex(_Load):
    approx_shard_bytes: int | None = None  # packs small files; a Vortex file is never cut

    def describe(self) -> str:
        return f"load_vortex({', '.join(_sizing_extras(self) + self._extras())})"


@dataclass(frozen=True)
class LoadFile(_Load):
    on_bad_record: str = "raise"
    approx_shard_bytes: int | None = None

    def describe(self) -> str:
        return f"load_file({', '.join(_sizing_extras(self) + self._extras())})"


@dataclass(frozen=True)
class LoadWarc(_Load):
    on_bad_record: str = "raise"
    approx_shard_bytes: int | None = None

    def describe(self) -> str:
        extras = [f"on_bad_record={self.on_bad_record!r}"] if self.on_bad_record != "raise" else []
        return f"load_warc({', '.join(_sizing_extras(self) + extras + self._extras())})"


OutputPattern = Union[str, Callable[[int, int], str]]


def _pattern_text(pattern: OutputPattern) -> str:
    return repr(pattern) if isinstance(pattern, str) else callable_name(pattern)


@dataclass(frozen=True)
class WriteJsonl:
    pattern: OutputPattern
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_jsonl({_pattern_text(self.pattern)}, skip_existing={self.skip_existing})"


@dataclass(frozen=True)
class WriteParquet:
    pattern: OutputPattern
    schema: Any = None
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_parquet({_pattern_text(self.pattern)}, skip_existing={self.skip_existing})"


@dataclass(frozen=True)
class WriteBinary:
    pattern: OutputPattern
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_binary({_pattern_text(self.pattern)}, skip_existing={self.skip_existing})"


@dataclass(frozen=True)
class WriteTokens:
    pattern: OutputPattern
    field: str = "input_ids"
    dtype: str = "uint32"
    skip_existing: bool = False

    def describe(self) -> str:
        return (f"write_tokens({_pattern_text(self.pattern)}, field={self.field!r}, dtype={self.dtype!r}, "
                f"skip_existing={self.skip_existing})")


@dataclass(frozen=True)
class WriteVortex:
    pattern: OutputPattern
    schema: Any = None
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_vortex({_pattern_text(self.pattern)}, skip_existing={self.skip_existing})"


LoadOp = Union[LoadJsonl, LoadParquet, LoadVortex, LoadFile, LoadWarc]
LOAD_OPS = (LoadJsonl, LoadParquet, LoadVortex, LoadFile, LoadWarc)
_FIXED_FORMATS = {LoadJsonl: FileFormat.JSONL, LoadParquet: FileFormat.PARQUET, LoadVortex: FileFormat.VORTEX, LoadWarc: FileFormat.WARC}


def fixed_format(load: Any) -> FileFormat | None:
    """The format a loader reads every file as; None for `load_file` (it asks each file's extension)."""
    return _FIXED_FORMATS.get(type(load))


def loader_reads_source(ops: tuple) -> bool:
    """Whether the first op that is not a filter is a loader, so a `from_list` source's items
    are the paths it reads (`from_list(paths).filter(f).load_jsonl()`)."""
    first = next((record for record in ops if not isinstance(record, (Filter, FilterExpr))), None)
    return isinstance(first, LOAD_OPS)


WriteOp = Union[WriteJsonl, WriteParquet, WriteVortex, WriteBinary, WriteTokens]
WRITE_OPS = (WriteJsonl, WriteParquet, WriteVortex, WriteBinary, WriteTokens)
StreamOp = Union[
    Map, MapBatches, WithColumns, Filter, FilterExpr, Select, FlatMap, MapShard, Window, WindowBy, TakePerShard, LoadJsonl, LoadParquet, LoadVortex,
    LoadFile, LoadWarc, WriteJsonl, WriteParquet, WriteVortex, WriteBinary, WriteTokens,
]

_PATTERN_FIELDS = ("shard", "total", "basename")


def validate_output_pattern(pattern: OutputPattern) -> OutputPattern:
    """Check an output pattern at build time: a callable `(shard, total) -> path`, or a
    string whose `{...}` fields are only {shard}, {total} and {basename}."""
    if callable(pattern):
        return pattern
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"Output pattern must be a non-empty string or a callable (shard, total) -> path, got {pattern!r}")
    try:
        fields = pattern_fields(pattern)
    except ValueError as e:
        raise ValueError(f"Output pattern {pattern!r} is not a valid format string: {e}") from None
    unknown = [f for f in fields if f not in _PATTERN_FIELDS]
    if unknown:
        raise ValueError(
            f"Output pattern {pattern!r} uses unknown field(s) {unknown}; "
            "only {shard} (e.g. {shard:05d}), {total} and {basename} are filled in"
        )
    try:
        pattern.format(shard=0, total=1, basename="name")
    except (ValueError, TypeError) as e:
        raise ValueError(f"Output pattern {pattern!r} cannot be formatted ({{shard}}/{{total}} are integers): {e}") from None
    return pattern


def pattern_fields(pattern: str) -> list[str]:
    return [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]


def input_basename(path: str) -> str:
    """`{basename}` of an input file: its name without directory, compression suffix and
    format extension (`gs://b/raw/CC-01.jsonl.zst` -> `CC-01`)."""
    name = strip_compression_suffix(path.rstrip("/").rsplit("/", 1)[-1])
    stem, dot, _ = name.rpartition(".")
    return stem if dot and stem else name


def written_files(record: Any, path: str) -> list[str]:
    """Every file writer `record` makes for the shard whose output is `path`: a token cache
    shard is two (the tokens and their document offsets), the run record and cleanup count both."""
    if isinstance(record, WriteTokens):
        return [path, offsets_path(path)]
    return [path]


def shard_output_path(pattern: OutputPattern, shard: int, total: int, input_path: str | None = None) -> str:
    """The output path of one shard: the callable's answer, or the pattern filled in.

    Raises ValueError for `{basename}` without an input file, or a callable that does not
    return a non-empty string.
    """
    if callable(pattern):
        path = pattern(shard, total)
        if not isinstance(path, str) or not path:
            raise ValueError(f"output path function {callable_name(pattern)} must return a non-empty path string, "
                             f"got {path!r} for shard {shard} of {total}")
        return path
    basename = None
    if "basename" in pattern_fields(pattern):
        if input_path is None:
            raise ValueError(f"Output pattern {pattern!r} uses {{basename}} but shard {shard} has no single input file")
        basename = input_basename(input_path)
    return pattern.format(shard=shard, total=total, basename=basename)


def has_shard_field(pattern: OutputPattern) -> bool:
    return callable(pattern) or "shard" in pattern_fields(pattern)


def check_columns(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"columns must be a sequence of column names, got {columns!r}")
    return tuple(columns)


PER_ITEM_OPS = (Map, Filter, FilterExpr, Select, FlatMap, WithColumns)  # each item in, its items out: `.apply(stream)`
EXPRESSION_OPS = (FilterExpr, Select, WithColumns)  # ops that name columns, evaluated the same on records and batches


def watch_points(ops: Sequence[Any]) -> dict[int, set[tuple[str, ...]]]:
    """Where a stage watches for columns no record had (`zephyr.expr.presence`): the index of
    each op that begins a run of column ops (a Python `filter` between them keeps the run
    going: it keeps records as they are), and the column paths the run reads from its input.
    One watch per run: each record is looked at once, however many ops read the column."""
    points: dict[int, set] = {}
    start = None
    for index, record in enumerate(ops):
        if isinstance(record, EXPRESSION_OPS) and start is None:
            start = index
            points[index] = _run_reads(ops[index:])
        elif not isinstance(record, (Filter, *EXPRESSION_OPS)):
            start = None
    return points


def _run_reads(ops: Sequence[Any]) -> set[tuple[str, ...]]:
    """The column paths a run of column ops reads from its input: not those a `with_columns`
    of the run made; after a `select`, only what it kept can be read (`zephyr.plan.column_check`)."""
    reads: set = set()
    made: set = set()
    for record in ops:
        if isinstance(record, Filter):
            continue
        if not isinstance(record, EXPRESSION_OPS):
            break
        reads |= {path for path in record.reads() if path[0] not in made}
        if isinstance(record, Select):
            break
        if isinstance(record, WithColumns):
            made |= {name for name, _ in record.columns}
    return reads


def select_columns(record: Any, columns: tuple[str, ...]) -> dict:
    """The named keys of a dict record, in that order; missing keys are left out."""
    if not isinstance(record, dict):
        raise TypeError(f"select() needs dict records, got {type(record).__name__}: {record!r:.80}")
    return {c: record[c] for c in columns if c in record}
