"""Op records: what a Dataset asks for, as frozen data. How they run lives in `shard.py`.

Per-item ops (everything in `StreamOp`) transform one shard's stream and fuse into a single
stage; shuffle ops (`ShuffleOp`, see `zephyr.shuffle_ops`) cut a stage boundary.
"""

from __future__ import annotations

import string
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any, Union

__all__ = [
    "FlatMap",
    "Filter",
    "LoadFile",
    "LoadJsonl",
    "LoadParquet",
    "Map",
    "MapShard",
    "StreamOp",
    "TakePerShard",
    "Window",
    "WriteJsonl",
    "WriteParquet",
    "WriteOp",
    "callable_name",
    "validate_output_pattern",
]


def callable_name(fn: Callable) -> str:
    """A readable name for plans and errors: `normalize`, `<lambda at pipeline.py:12>`."""
    if hasattr(fn, "name_for_plan"):
        return fn.name_for_plan()
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if name.endswith("<lambda>"):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return f"<lambda at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}>"
    return name


@dataclass(frozen=True)
class Map:
    fn: Callable[[Any], Any]

    def describe(self) -> str:
        return f"map({callable_name(self.fn)})"


@dataclass(frozen=True)
class Filter:
    predicate: Callable[[Any], bool]

    def describe(self) -> str:
        return f"filter({callable_name(self.predicate)})"


@dataclass(frozen=True)
class FlatMap:
    fn: Callable[[Any], Any]

    def describe(self) -> str:
        return f"flat_map({callable_name(self.fn)})"


@dataclass(frozen=True)
class MapShard:
    fn: Callable[[Any], Any]

    def describe(self) -> str:
        return f"map_shard({callable_name(self.fn)})"


@dataclass(frozen=True)
class Window:
    size: int

    def describe(self) -> str:
        return f"window({self.size})"


@dataclass(frozen=True)
class TakePerShard:
    n: int

    def describe(self) -> str:
        return f"take_per_shard({self.n})"


@dataclass(frozen=True)
class LoadJsonl:
    on_bad_record: str = "raise"

    def describe(self) -> str:
        return "load_jsonl()" if self.on_bad_record == "raise" else f"load_jsonl(on_bad_record={self.on_bad_record!r})"


@dataclass(frozen=True)
class LoadParquet:
    columns: tuple[str, ...] | None = None

    def describe(self) -> str:
        return f"load_parquet(columns={list(self.columns)!r})" if self.columns else "load_parquet()"


@dataclass(frozen=True)
class LoadFile:
    on_bad_record: str = "raise"

    def describe(self) -> str:
        return "load_file()"


@dataclass(frozen=True)
class WriteJsonl:
    pattern: str
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_jsonl({self.pattern!r}, skip_existing={self.skip_existing})"


@dataclass(frozen=True)
class WriteParquet:
    pattern: str
    schema: Any = None
    skip_existing: bool = False

    def describe(self) -> str:
        return f"write_parquet({self.pattern!r}, skip_existing={self.skip_existing})"


WriteOp = Union[WriteJsonl, WriteParquet]
StreamOp = Union[Map, Filter, FlatMap, MapShard, Window, TakePerShard, LoadJsonl, LoadParquet, LoadFile, WriteJsonl, WriteParquet]

_PATTERN_FIELDS = ("shard", "total")


def validate_output_pattern(pattern: str) -> str:
    """Check an output pattern's `{...}` fields at build time: only {shard} and {total}."""
    if not isinstance(pattern, str) or not pattern:
        raise ValueError(f"Output pattern must be a non-empty string, got {pattern!r}")
    try:
        fields = [f for _, f, _, _ in string.Formatter().parse(pattern) if f is not None]
    except ValueError as e:
        raise ValueError(f"Output pattern {pattern!r} is not a valid format string: {e}") from None
    unknown = [f for f in fields if f not in _PATTERN_FIELDS]
    if unknown:
        raise ValueError(
            f"Output pattern {pattern!r} uses unknown field(s) {unknown}; "
            "only {shard} (e.g. {shard:05d}) and {total} are filled in"
        )
    try:
        pattern.format(shard=0, total=1)
    except (ValueError, TypeError) as e:
        raise ValueError(f"Output pattern {pattern!r} cannot be formatted with integers: {e}") from None
    return pattern


def output_path(pattern: str, shard: int, total: int) -> str:
    return pattern.format(shard=shard, total=total)


def has_shard_field(pattern: str) -> bool:
    return any(f == "shard" for _, f, _, _ in string.Formatter().parse(pattern) if f is not None)


def check_columns(columns: Sequence[str] | None) -> tuple[str, ...] | None:
    if columns is None:
        return None
    if isinstance(columns, str) or not all(isinstance(c, str) for c in columns):
        raise TypeError(f"columns must be a sequence of column names, got {columns!r}")
    return tuple(columns)
