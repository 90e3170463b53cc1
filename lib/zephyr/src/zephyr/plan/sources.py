"""Where a Dataset's shards come from. Resolved (globbed) when the plan is built, not before.

With `load_parquet(approx_shard_bytes=N)` right after the source, the planner also splits
each Parquet file into slices of whole row groups of about N bytes (`split_parquet_shards`),
one shard per slice; reading a slice reads only its row groups.
"""

from __future__ import annotations

from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from typing import Any, Union

from zephyr.errors import InputNotFoundError
from zephyr.io.files import expand_glob_versions, file_versions
from zephyr.io.files import url_to_fs
from zephyr.io.formats import FileFormat, format_for

__all__ = ["FilesSource", "ListSource", "ParquetSlice", "Source", "SourceShard", "input_path_of", "resolve_source", "split_parquet_shards", "with_path_versions"]


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


def input_path_of(item: Any) -> str | None:
    """The file a path item (a path string or a ParquetSlice) reads; None for other items."""
    if isinstance(item, ParquetSlice):
        return item.path
    return item if isinstance(item, str) else None


def split_parquet_shards(shards: Sequence[SourceShard], approx_bytes: int, parquet_only: bool = False) -> list[SourceShard]:
    """One shard per slice of about `approx_bytes` (compressed, whole row groups) of each file.

    Reads every file's footer (in parallel). A row group larger than `approx_bytes` is a
    slice of its own: row groups are never split. With `parquet_only`, other files (by
    extension) stay one shard each.
    """
    paths: list[tuple[str, bool]] = []  # (path, whether it came from from_files)
    for shard in shards:
        for item in shard.items:
            if not isinstance(item, str):
                raise TypeError(f"approx_shard_bytes splits input files, so the items must be paths; got {type(item).__name__}: {item!r:.100}")
            paths.append((item, shard.path is not None, shard.version))
    splittable = list(dict.fromkeys(p for p, _, _ in paths if not parquet_only or format_for(p) is FileFormat.PARQUET))
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(splittable)))) as pool:
        sizes = dict(zip(splittable, pool.map(_row_group_sizes, splittable)))
    out: list[SourceShard] = []
    for path, from_files, version in paths:
        file = path if from_files else None
        if path not in sizes:
            out.append(SourceShard((path,), path, file, version))
            continue
        for groups in _pack(sizes[path], approx_bytes):
            piece = ParquetSlice(path, groups) if groups else path  # a file without row groups: itself
            out.append(SourceShard((piece,), str(piece), file, version))
    return out


def _row_group_sizes(path: str) -> list[int]:
    import pyarrow.parquet as pq


    fs, fs_path = url_to_fs(path)
    try:
        with fs.open(fs_path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except FileNotFoundError as e:
        raise InputNotFoundError(f"Input file not found: {path}") from e
    except Exception as e:
        raise ValueError(f"{path}: not a readable Parquet file, so it cannot be split by approx_shard_bytes: {e}") from e
    return [sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)) for rg in map(meta.row_group, range(meta.num_row_groups))]


def _pack(sizes: list[int], approx_bytes: int) -> list[tuple[int, ...]]:
    """Consecutive row groups in runs of about `approx_bytes`; an empty file is one empty slice."""
    runs: list[tuple[int, ...]] = []
    current: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and total + size > approx_bytes:
            runs.append(tuple(current))
            current, total = [], 0
        current.append(index)
        total += size
    if current or not runs:
        runs.append(tuple(current))
    return runs


def _label_of(items: tuple[Any, ...]) -> str:
    if len(items) == 1:
        text = repr(items[0]) if not isinstance(items[0], str) else items[0]
    else:
        text = f"{len(items)} items"
    return text if len(text) <= 120 else text[:117] + "..."
