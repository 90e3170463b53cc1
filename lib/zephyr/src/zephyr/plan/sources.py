"""Where a Dataset's shards come from. Resolved (globbed) when the plan is built, not before.

A shard's items are paths, or pieces of a file (`ParquetSlice`: whole row groups; `ByteRange`:
the lines or WARC records that start in a span of bytes), which a loader reads. With
`approx_shard_bytes=N` on the loader right after the source, `zephyr.plan.sizing` packs small
files into one shard and cuts large ones into such pieces, toward N bytes a shard.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Union

from zephyr.errors import InputNotFoundError
from zephyr.io.files import expand_glob_versions, file_versions
from zephyr.io.files import url_to_fs

__all__ = ["ByteRange", "FilesSource", "ListSource", "ParquetSlice", "Source", "SourceShard", "input_path_of", "resolve_source",
           "span_of", "with_path_versions"]


@dataclass(frozen=True)
class ListSource:
    """Items held by the driver; `shards[i]` is the tuple of items of shard i."""

    shards: tuple[tuple[Any, ...], ...]
    label: str = "from_list"

    def describe(self) -> str:
        items = sum(len(s) for s in self.shards)
        return f"{self.label}({items} items)"


@dataclass(frozen=True)
class FilesSource:
    """Paths or fsspec globs; each matching file becomes one shard whose single item is its path."""

    patterns: tuple[str, ...]
    empty_glob_ok: bool = False

    def describe(self) -> str:
        shown = ", ".join(repr(p) for p in self.patterns[:3])
        more = f", ... ({len(self.patterns)} in all)" if len(self.patterns) > 3 else ""
        return f"from_files({shown}{more})"


Source = Union[ListSource, FilesSource]


@dataclass(frozen=True)
class SourceShard:
    """What one task of the first stage receives: its items (small: paths or list items)."""

    items: tuple[Any, ...]
    label: str  # a short description for errors and progress, e.g. the file path
    path: str | None = None  # the input file of a `from_files` shard (for `{basename}`); None for list items
    # what the shard's input files held when the plan was made (`io.files.file_version`): part
    # of the plan's fingerprint, so a resumed run never reuses work made from other contents
    version: str = ""


def _is_directory(path: str) -> bool:
    try:
        fs, fs_path = url_to_fs(path)
        return fs.isdir(fs_path)
    except Exception:  # an unreachable store: the plain "does not exist" says enough
        return False


def resolve_source(source: Source) -> list[SourceShard]:
    """Expand a source into its shards. Raises FileNotFoundError for empty globs or missing files."""
    if isinstance(source, ListSource):
        return [SourceShard(items, _label_of(items)) for items in source.shards]
    versions: dict[str, str] = {}
    for pattern in source.patterns:
        matches = expand_glob_versions(pattern)
        if not matches:
            if not any(c in pattern for c in "*?["):
                if _is_directory(pattern):
                    base = pattern.rstrip("/")
                    raise InputNotFoundError(
                        f"Input {pattern!r} is a directory; from_files takes files or a glob, e.g. "
                        f"from_files('{base}/*.jsonl') or from_files('{base}/**/*') for every file under it")
                raise InputNotFoundError(f"Input file {pattern!r} does not exist")
            if not source.empty_glob_ok:
                escape = " ('[' starts a character class: write '[[]' for a literal '[')" if "[" in pattern else ""
                raise InputNotFoundError(f"Input pattern {pattern!r} matched no files{escape} (pass empty_glob_ok=True to allow this)")
        versions.update(matches)
    # overlapping patterns must not read a file twice; one sorted order whatever the patterns
    return [SourceShard((p,), p, p, versions[p]) for p in sorted(versions)]


def with_path_versions(shards: Sequence[SourceShard]) -> list[SourceShard]:
    """List shards whose items are paths (read by a loader) with those files' versions, so
    rewriting an input in place changes the plan's fingerprint as it does for `from_files`."""
    paths = [item for shard in shards for item in shard.items if isinstance(item, str)]
    if not paths:
        return list(shards)
    versions = file_versions(paths)
    return [replace(s, version=";".join(versions[i] for i in s.items if isinstance(i, str))) for s in shards]


@dataclass(frozen=True)
class ParquetSlice:
    """Some whole row groups of one Parquet file: what a shard of a split file reads."""

    path: str
    row_groups: tuple[int, ...]

    def __str__(self) -> str:
        first, last = self.row_groups[0], self.row_groups[-1]
        groups = f"row group {first}" if first == last else f"row groups {first}-{last}"
        return f"{self.path} [{groups}]"


@dataclass(frozen=True)
class ByteRange:
    """Bytes [start, end) of a JSON Lines file (uncompressed) or a WARC file (plain, or gzipped
    record by record): what a shard of a cut file reads. It owns the lines (WARC records) that
    start in the span, wherever they end: a reader skips to the first line start at or after
    `start` and reads on to the end of the line that holds byte `end - 1` (the split rule of
    Hadoop's text input), so pieces that tile a file read each line once."""

    path: str
    start: int
    end: int

    def __str__(self) -> str:
        return f"{self.path} [bytes {self.start}-{self.end}]"


def input_path_of(item: Any) -> str | None:
    """The file a path item (a path string, a ParquetSlice or a ByteRange) reads; None for other items."""
    if isinstance(item, (ParquetSlice, ByteRange)):
        return item.path
    return item if isinstance(item, str) else None


def span_of(item: Any) -> tuple[int, int] | None:
    """The (start, end) bytes a `ByteRange` item reads; None for anything else (a whole file)."""
    return (item.start, item.end) if isinstance(item, ByteRange) else None


def _label_of(items: tuple[Any, ...]) -> str:
    if len(items) == 1:
        text = repr(items[0]) if not isinstance(items[0], str) else items[0]
    else:
        text = f"{len(items)} items"
    return text if len(text) <= 120 else text[:117] + "..."
