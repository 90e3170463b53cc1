"""Op records that cut a stage boundary: group_by, deduplicate, reshard, sorted_merge_join, and
group_by rounds repeated until the data settles (`GroupByRounds`).

`reduce`/`count` need no record of their own: they compile to
`map_shard(local) -> reshard(1) -> map_shard(global)` in `dataset.py`.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from zephyr.naming import callable_name

__all__ = ["Deduplicate", "GroupBy", "GroupByRounds", "Reshard", "ShuffleOp", "SortedMergeJoin"]


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
class GroupByRounds:
    """A group_by run as rounds, as many as the data needs, then `final` over the last round's output.

    Round r (from 1) groups by `key` (sorted by `sort_by`) and runs `reducers[(r - 1) % len(reducers)]`;
    its output goes through the same shuffle again. When a round's shards are done, the runner
    adds up the counter `counter` over them: the reducers count there what in their input is not
    yet settled (input that a round leaves as it is must count 0). Zero: the round's input was
    settled, so its output is the same, and `final` groups it by `key` and reduces it. Otherwise
    another round, up to `max_rounds`; past that the run raises `exhausted(max_rounds, count)`.

    The rounds are stages the runner adds while the run goes (`zephyr.plan.rounds`); each has its
    own identity, chained on the one before, so a rerun resumes the rounds an earlier run finished.
    `max_rounds` is not part of any identity: a rerun with a larger budget reuses every round.
    """

    key: Callable[[Any], Any]
    reducers: tuple[Callable[..., Any], ...]
    final: Callable[..., Any]
    counter: str
    max_rounds: int
    exhausted: Callable[[int, int], Exception]
    sort_by: Callable[[Any], Any] | None = None
    num_output_shards: int | None = None
    name: str = "rounds"  # the run's counter `zephyr/<name>_rounds` says how many ran

    def round_op(self, number: int) -> GroupBy:
        """Round `number` (from 1) as the group_by it is."""
        return GroupBy(self.key, self.reducers[(number - 1) % len(self.reducers)], self.sort_by, self.num_output_shards)

    def final_op(self) -> GroupBy:
        return GroupBy(self.key, self.final, self.sort_by, self.num_output_shards)

    def describe(self) -> str:
        reducers = " | ".join(callable_name(r) for r in self.reducers)
        return (f"group_by_rounds({callable_name(self.key)}, {reducers}, until {self.counter} is 0, "
                f"at most {self.max_rounds}, then {callable_name(self.final)})")


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


ShuffleOp = GroupBy | GroupByRounds | Deduplicate | Reshard
