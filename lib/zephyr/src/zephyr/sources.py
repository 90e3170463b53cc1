"""Where a Dataset's shards come from. Resolved (globbed) when the plan is built, not before."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Union

from zephyr.io.files import expand_glob

__all__ = ["FilesSource", "ListSource", "Source", "SourceShard", "resolve_source"]


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


def resolve_source(source: Source) -> list[SourceShard]:
    """Expand a source into its shards. Raises FileNotFoundError for empty globs or missing files."""
    if isinstance(source, ListSource):
        return [SourceShard(items, _label_of(items)) for items in source.shards]
    paths: list[str] = []
    for pattern in source.patterns:
        matches = expand_glob(pattern)
        if not matches:
            if not any(c in pattern for c in "*?["):
                raise FileNotFoundError(f"Input file {pattern!r} does not exist")
            if not source.empty_glob_ok:
                raise FileNotFoundError(f"Input pattern {pattern!r} matched no files (pass empty_glob_ok=True to allow this)")
        paths.extend(matches)
    # overlapping patterns must not read a file twice; one sorted order whatever the patterns
    return [SourceShard((p,), p) for p in sorted(set(paths))]


def _label_of(items: tuple[Any, ...]) -> str:
    if len(items) == 1:
        text = repr(items[0]) if not isinstance(items[0], str) else items[0]
    else:
        text = f"{len(items)} items"
    return text if len(text) <= 120 else text[:117] + "..."
