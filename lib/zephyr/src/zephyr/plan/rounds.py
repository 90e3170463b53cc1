"""The rounds of a `GroupByRounds`: stages a run adds while it goes, as many as the data needs.

The compiled plan holds round 1 only: a stage marked with `Rounds`, reading the rounds' shuffle
and writing the same shuffle again, followed by the stage that runs `final`. When a round's
shards are done, the runner adds up their counts of what is not yet settled (`unsettled`); while
that is not zero, it inserts `next_round(stage)` after the round (`with_stage_after` renumbers
the stages behind it, and the stages a dedup counts in), which reads the round's output with the
next reducer. The final stage reads whichever round came last: every round writes the same
partitioning, so it needs no change.

A round's identity is the round before's chained with its number and reducer: deterministic, so
a rerun finds the rounds an earlier run finished (their manifests carry their counts, so the
rerun decides the same way) and resumes at the first unfinished one.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Any

from zephyr.dedup.report import DedupStages
from zephyr.plan.fingerprint import Identity, identify
from zephyr.plan.shuffle_ops import GroupByRounds
from zephyr.shuffle.reduce import ReduceGroups, ShuffleReader

__all__ = ["Rounds", "next_round", "round_reader", "unsettled", "with_stage_after"]


@dataclass(frozen=True)
class Rounds:
    """Marks a stage as round `number` of `record`."""

    record: GroupByRounds
    number: int = 1

    def describe(self) -> str:
        return f"round {self.number}; another while {self.record.counter} > 0, at most {self.record.max_rounds}"


def round_reader(record: GroupByRounds, number: int, partitions: int) -> ShuffleReader:
    """What round `number` reads: the rounds' shuffle, grouped and reduced by its reducer."""
    group = record.round_op(number)
    return ShuffleReader(partitions, ReduceGroups(group.reducer), f"round {number}: {group.describe()}",
                         sorted_by_value=group.sort_by is not None)


def unsettled(stage: Any, results: list) -> int:
    """What round `stage`'s shards found not yet settled in its input, added up (quarantined shards have no result)."""
    return sum(result.counters.get(stage.rounds.record.counter, 0) for result in results if result is not None)


def next_round(stage: Any) -> Any:
    """The stage of the round after round stage `stage`, placed right after it: the same shuffle
    read with the next reducer, its own identity (its sink is to be bound to its own scratch root)."""
    rounds = replace(stage.rounds, number=stage.rounds.number + 1)
    reader = round_reader(rounds.record, rounds.number, stage.sink.num_partitions)
    ident = identify(("round", rounds.number), (reader.label, reader), after=Identity(stage.fingerprint, stage.not_resumable))
    return replace(stage, index=stage.index + 1, num_shards=reader.num_partitions, input=reader, input_label=reader.label,
                   fingerprint=ident.digest, not_resumable=ident.reason, rounds=rounds)


def with_stage_after(plan: Any, stage: Any) -> Any:
    """`plan` with `stage` inserted at its index, the stages from there on renumbered one later
    (and so the stages each dedup counts in, `Plan.dedups`)."""
    before = plan.stages[: stage.index]
    after = tuple(replace(s, index=s.index + 1) for s in plan.stages[stage.index :])
    dedups = tuple(_shifted(d, stage.index) for d in plan.dedups)
    return replace(plan, stages=(*before, stage, *after), dedups=dedups)


def _shifted(dedup: DedupStages, index: int) -> DedupStages:
    """`dedup` with its stages from `index` on one later."""
    return replace(dedup, stage_in=dedup.stage_in + (dedup.stage_in >= index),
                   stage_out=dedup.stage_out + (dedup.stage_out >= index))
