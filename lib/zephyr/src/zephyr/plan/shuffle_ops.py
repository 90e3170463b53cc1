"""Op records that cut a stage boundary: group_by, deduplicate, reshard, sorted_merge_join.

`reduce`/`count` need no record of their own: they compile to
`map_shard(local) -> reshard(1) -> map_shard(global)` in `dataset.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephyr.naming import callable_name

__all__ = ["Deduplicate", "GroupBy", "Reshard", "ShuffleOp", "SortedMergeJoin"]


@dataclass(frozen=True)
class GroupBy:
    key: Callable[[Any], Any]
    reducer: Callable[..., Any]
    sort_by: Callable[[Any], Any] | None = None
    num_output_shards: int | None = None
    combiner: Callable[..., Any] | None = None

    def describe(self) -> str:
        extra = f", sort_by={callable_name(self.sort_by)}" if self.sort_by else ""
        extra += f", combiner={callable_name(self.combiner)}" if self.combiner else ""
        return f"group_by({callable_name(self.key)}, {callable_name(self.reducer)}{extra})"


@dataclass(frozen=True)
class Deduplicate:
    key: Callable[[Any], Any]
    num_output_shards: int | None = None

    def describe(self) -> str:
        return f"deduplicate({callable_name(self.key)})"


@dataclass(frozen=True)
class Reshard:
    num_shards: int

    def describe(self) -> str:
        return f"reshard({self.num_shards})"


@dataclass(frozen=True)
class SortedMergeJoin:
    right: Any  # a Dataset
    left_key: Callable[[Any], Any]
    right_key: Callable[[Any], Any]
    how: str = "inner"
    combiner: Callable[[Any, Any], Any] | None = None  # None: {**left, **right}

    def describe(self) -> str:
        extra = f", combiner={callable_name(self.combiner)}" if self.combiner is not None else ""
        return f"sorted_merge_join({callable_name(self.left_key)}, {callable_name(self.right_key)}, how={self.how!r}{extra})"


ShuffleOp = GroupBy | Deduplicate | Reshard
