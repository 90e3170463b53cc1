"""User counters: `zephyr.counters.increment("dropped/short", 1)` inside any user function.

Each shard task collects its own counts (thread-local, so threadpool shards never mix) and
returns them with its result; the runner adds them up per run. Outside a running shard,
`increment` does nothing, so the same function works in a plain unit test.

The reference project's scoped API works too: `counters.pipeline.update_counter(name, v)`,
`set_counter`, `set_aggregation(name, Aggregation.MAX)` (sum, max, min or average, combined
the same way across shards), `counters.stage("tokenize")` and `counters.current_stage()`
(counters tagged with a stage; a run's totals merge equal names across stages).

A non-sum counter travels in a shard's plain {name: number} dict with a companion entry
`zephyr/aggregation:<kind>:<name>` holding its weight (observations, for an average), so
results stay JSON numbers; `Totals` folds them and `Totals.public()` drops the companions.
"""

from __future__ import annotations

import enum
import threading
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

__all__ = [
    "Aggregation",
    "ScopedCounters",
    "Totals",
    "absorb",
    "collecting",
    "current",
    "current_stage",
    "get_counters",
    "increment",
    "pipeline",
    "public",
    "stage",
]

_local = threading.local()
_COMPANION = "zephyr/aggregation:"


class Aggregation(enum.StrEnum):
    """How a counter's values combine, within a shard and across shards."""

    SUM = "sum"
    MAX = "max"
    MIN = "min"
    AVERAGE = "average"


def _companion(kind: Aggregation, name: str) -> str:
    return f"{_COMPANION}{kind.value}:{name}"


class _ShardCounts:
    """One shard's counters by stage tag and name, and the flat per-name view it returns."""

    def __init__(self, stage_name: str | None):
        self.flat: Counter = Counter()
        self.stage_name = stage_name
        # while the shard has only pipeline-scope sums, they are the flat view itself (`increment`'s
        # hot path adds to one Counter); the first stage-scoped or non-sum counter splits them
        self.split = False
        self.sums: dict[str | None, Counter] = {None: self.flat}
        self.others: dict[tuple[str | None, str], list] = {}  # max/min/average: -> [value, observations]
        self.kinds: dict[tuple[str | None, str], Aggregation] = {}

    def update(self, scope: str | None, name: str, value: Any, overwrite: bool = False) -> None:
        kind = self.kinds.get((scope, name), Aggregation.SUM) if self.kinds else Aggregation.SUM
        if not self.split and (scope is not None or kind is not Aggregation.SUM):
            self.split_out()
        if kind is Aggregation.SUM:
            if not self.split:
                self.flat[name] += value - self.flat.get(name, 0) if overwrite else value
                return
            sums = self.sums.setdefault(scope, Counter())
            delta = value - sums.get(name, 0) if overwrite else value
            sums[name] += delta
            self.flat[name] += delta
            return
        entry = self.others.get((scope, name))
        if entry is None or overwrite:
            self.others[(scope, name)] = [value, 1]
        elif kind is Aggregation.MAX:
            entry[0] = max(entry[0], value)
        elif kind is Aggregation.MIN:
            entry[0] = min(entry[0], value)
        else:
            entry[0] = (entry[0] * entry[1] + value) / (entry[1] + 1)
            entry[1] += 1
        self._flatten(name, kind)

    def split_out(self) -> None:
        """Keep pipeline sums apart from the flat view from now on (a scoped or non-sum counter came)."""
        if not self.split:
            self.split = True
            self.sums[None] = Counter(self.flat)

    def _flatten(self, name: str, kind: Aggregation) -> None:
        """The flat value of `name`: its scopes' entries combined by `kind`."""
        total: Counter = Counter()
        for (_, n), (value, seen) in self.others.items():
            if n == name:
                fold(total, name, value, kind, seen if kind is Aggregation.AVERAGE else 1)
        self.flat[name] = total[name]
        self.flat[_companion(kind, name)] = total[_companion(kind, name)]

    def of_scope(self, scope: str | None) -> dict:
        found = dict(self.sums.get(scope, {}))
        found.update({name: entry[0] for (s, name), entry in self.others.items() if s == scope})
        return found


def absorb(counts: dict) -> None:
    """Fold a part's counters (a shard dict, companions included) into the running shard's, as
    the run folds shards (used for the chunks of a split shard; no-op outside a shard)."""
    mine = _counts()
    if mine is None or not counts:
        return
    kinds = {name: Aggregation(kind) for kind, _, name in (key[len(_COMPANION):].partition(":") for key in counts if key.startswith(_COMPANION))}
    for name, value in counts.items():
        if name.startswith(_COMPANION):
            continue
        kind = kinds.get(name)
        if kind is None:
            mine.update(None, name, value)
            continue
        mine.kinds[(None, name)] = kind
        weight = counts[_companion(kind, name)] if kind is Aggregation.AVERAGE else 1
        entry = mine.others.get((None, name))
        if entry is None:
            mine.split_out()
            mine.others[(None, name)] = [value, weight]
        else:
            merged: Counter = Counter({name: entry[0], _companion(kind, name): entry[1]})
            fold(merged, name, value, kind, weight)
            mine.others[(None, name)] = [merged[name], merged[_companion(kind, name)] if kind is Aggregation.AVERAGE else 1]
        mine._flatten(name, kind)


def fold(totals: Counter, name: str, value: Any, kind: Aggregation, weight: int) -> None:
    """Combine one more `value` (seen `weight` times) into `totals[name]` by `kind`."""
    companion = _companion(kind, name)
    if name not in totals:
        totals[name] = value
    elif kind is Aggregation.MAX:
        totals[name] = max(totals[name], value)
    elif kind is Aggregation.MIN:
        totals[name] = min(totals[name], value)
    elif kind is Aggregation.AVERAGE:
        seen = totals.get(companion, 0)
        totals[name] = (totals[name] * seen + value * weight) / (seen + weight) if seen + weight else value
    else:
        totals[name] += value
    totals[companion] = totals.get(companion, 0) + weight if kind is Aggregation.AVERAGE else 1


class Totals(Counter):
    """A run's counters: sums, except names a shard marked max/min/average (see the module doc)."""

    def update(self, other=None, /, **kwargs) -> None:  # type: ignore[override]
        counts = dict(other or {}, **kwargs)
        kinds = {}
        for key in counts:
            if key.startswith(_COMPANION):
                kind, _, name = key[len(_COMPANION):].partition(":")
                kinds[name] = Aggregation(kind)
        for name, value in counts.items():
            if name.startswith(_COMPANION):
                continue
            kind = kinds.get(name)
            if kind is None:
                self[name] += value
            else:
                fold(self, name, value, kind, counts[_companion(kind, name)])

    def public(self) -> dict:
        """The counters by name, without the aggregation companions."""
        return public(self)


def public(counts: dict) -> dict:
    """`counts` without the aggregation companions (what users and status pages see)."""
    return {name: value for name, value in counts.items() if not name.startswith(_COMPANION)}


class ScopedCounters:
    """Counters of one scope: the whole pipeline (`counters.pipeline`) or one stage tag."""

    def __init__(self, stage_name: str | None = None):
        self.stage_name = stage_name

    def update_counter(self, name: str, value: int | float = 1) -> None:
        """Add `value` (or take the max/min/running average, per `set_aggregation`); no-op outside a shard."""
        counts = _counts()
        if counts is not None:
            counts.update(self.stage_name, name, value)

    increment = update_counter

    def set_counter(self, name: str, value: int | float) -> None:
        """Replace the counter's value in this shard (an average restarts from it)."""
        counts = _counts()
        if counts is not None:
            counts.update(self.stage_name, name, value, overwrite=True)

    def set_aggregation(self, name: str, aggregation: Aggregation | str) -> None:
        """How `name` combines from now on: Aggregation.SUM (the default), MAX, MIN or AVERAGE."""
        counts = _counts()
        if counts is not None:
            counts.kinds[(self.stage_name, name)] = Aggregation(aggregation)

    def get_counters(self) -> dict:
        """This scope's counters in the running shard so far ({} outside a shard)."""
        counts = _counts()
        return counts.of_scope(self.stage_name) if counts is not None else {}

    def __repr__(self) -> str:
        return f"ScopedCounters(stage={self.stage_name!r})"


pipeline = ScopedCounters(None)


def stage(name: str) -> ScopedCounters:
    """Counters tagged with stage `name` (the run's totals merge them with equal names elsewhere)."""
    return ScopedCounters(name)


def current_stage() -> ScopedCounters:
    """Counters tagged with the stage running this shard (pipeline scope outside a shard)."""
    counts = _counts()
    return ScopedCounters(counts.stage_name if counts is not None else None)


def _counts() -> _ShardCounts | None:
    return getattr(_local, "counts", None)


def increment(name: str, n: int = 1) -> None:
    """Add `n` to the counter `name` of the shard being run (no-op outside a run)."""
    counts = getattr(_local, "counts", None)
    if counts is None:
        return
    if counts.split:
        counts.update(None, name, n)
    else:  # nothing but pipeline sums in this shard: the hot path of per-record counting
        counts.flat[name] += n


def current() -> dict:
    """A copy of the counts of the shard being run so far ({} outside a run)."""
    counts = _counts()
    return Totals(counts.flat).public() if counts is not None else {}


get_counters = current


@contextmanager
def collecting(stage_name: str | None = None) -> Iterator[Counter]:
    """Collect the counters set in this thread into a fresh Counter (used by shard tasks)."""
    previous = _counts()
    counts = _ShardCounts(stage_name)
    _local.counts = counts
    try:
        yield counts.flat
    finally:
        _local.counts = previous
