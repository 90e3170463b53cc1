"""Quarantine: a shard that fails on every attempt is set aside so that the rest of the run goes on.

With `on_shard_failure="quarantine"` (a backend option; `zephyr --on-shard-failure=quarantine`)
a shard whose user code or input fails on each of its attempts (`max_user_retries` + 1), or
whose worker dies more than `max_infra_retries` times, is not the end of the run: `StageLoop`
hands it here with its error and goes on. A quarantined shard contributes nothing downstream:

- a writer shard leaves no output (writes are atomic: nothing was renamed into place);
- a scatter map shard has no manifest, so no reduce reads its runs (the reducers read only the
  runs that manifests list), and the other map shards' manifests stay for a rerun;
- every later stage's work is partial, so it is kept apart from complete work: a later scatter
  writes under its own scratch root (`<root>-without-<digest>`) and a later skip_existing
  writer's provenance names what was missing, so a rerun with the poison fixed recomputes them
  instead of reusing outputs made without the quarantined shards.

When every stage has run, the runner raises `QuarantinedShardsError` listing the shards; the run
record, the status page and the summary carry the same report. A rerun retries only what is not
done: finished map shards resume from their manifests, skip_existing outputs are kept.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, replace

from zephyr.errors import ShardError
from zephyr.tasks import ShardTask

__all__ = ["ON_SHARD_FAILURE", "Quarantine", "QuarantinedShard", "QuarantinedShardsError", "check_on_shard_failure"]

logger = logging.getLogger("zephyr")

ON_SHARD_FAILURE = ("fail", "quarantine")
MAX_TRACEBACK = 4000  # characters of each quarantined shard's traceback kept (its end: where it failed)
SHOWN = 20  # quarantined shards listed in an error message


def check_on_shard_failure(value: str) -> str:
    """`value` if it is a valid `on_shard_failure`, else ValueError naming the choices."""
    if value not in ON_SHARD_FAILURE:
        raise ValueError(f"on_shard_failure must be one of {', '.join(map(repr, ON_SHARD_FAILURE))}, got {value!r}")
    return value


@dataclass(frozen=True)
class QuarantinedShard:
    """One shard set aside: where it was, what it read, and how it failed."""

    stage: int
    shard: int
    source: str  # the shard's label: its input file, or its partition after a shuffle
    input_path: str | None  # the from_files input file, when it has one
    error_type: str
    message: str
    traceback: str
    record: str | None  # the record a per-item function failed on, when known
    attempts: int
    at: float

    def to_dict(self) -> dict:
        return dict(self.__dict__)

    def describe(self) -> str:
        at = f" at {self.record}" if self.record else ""
        return f"stage {self.stage}, shard {self.shard} (source: {self.source}): {self.error_type}: {self.message[:300]}{at}"


class QuarantinedShardsError(RuntimeError):
    """The run finished every shard it could, but these were quarantined (`on_shard_failure="quarantine"`).

    `.shards` lists them (dicts: stage, shard, source, input_path, error_type, message, traceback,
    record, attempts). Outputs of the other shards are complete; a rerun retries the rest.
    """

    def __init__(self, shards: list[dict]):
        self.shards = shards
        lines = [QuarantinedShard(**s).describe() for s in shards[:SHOWN]]
        more = [f"... and {len(shards) - SHOWN} more (see the run record)"] if len(shards) > SHOWN else []
        super().__init__(
            f"{len(shards)} shard(s) quarantined after failing on every attempt; the other shards finished and their "
            "outputs are complete. Fix the input or the code and run again: only the unfinished shards run.\n  "
            + "\n  ".join(lines + more)
        )

    def __reduce__(self):
        return (QuarantinedShardsError, (self.shards,))


class Quarantine:
    """The shards one run set aside. `on_add` (the run's status) hears of each as it happens."""

    def __init__(self, on_add: Callable[[int, dict], None] | None = None):
        self.shards: list[QuarantinedShard] = []
        self._on_add = on_add

    def __bool__(self) -> bool:
        return bool(self.shards)

    def add(self, task: ShardTask, error: ShardError, attempts: int) -> QuarantinedShard:
        entry = QuarantinedShard(task.stage, task.shard, task.label, task.input_path, error.error_type,
                                 error.error_message, error.traceback_text[-MAX_TRACEBACK:], error.record, attempts,
                                 time.time())
        self.shards.append(entry)
        logger.warning("zephyr: quarantined %s (failed %d time(s)); the run goes on without it", entry.describe(), attempts)
        if self._on_add is not None:
            self._on_add(task.stage, entry.to_dict())
        return entry

    def before(self, stage: int) -> list[QuarantinedShard]:
        """The shards quarantined in stages before `stage`: what its input lacks."""
        return [q for q in self.shards if q.stage < stage]

    def error(self) -> QuarantinedShardsError:
        return QuarantinedShardsError([q.to_dict() for q in sorted(self.shards, key=lambda q: (q.stage, q.shard))])


def missing_digest(missing: list[QuarantinedShard]) -> str:
    """A short name for a set of quarantined shards (the same set, the same name)."""
    text = ",".join(f"{q.stage}:{q.shard}" for q in sorted(missing, key=lambda q: (q.stage, q.shard)))
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def without_missing(stage, tasks: list[ShardTask], missing: list[QuarantinedShard]):
    """`stage` and its `tasks` when its input lacks the `missing` shards' data: a scatter writes
    under its own scratch root, and skip_existing outputs record the gap in their provenance, so
    neither is taken for complete work by a later run. Returns (stage, tasks); `tasks` is updated
    in place (it may carry attributes)."""
    if not missing:
        return stage, tasks
    digest = missing_digest(missing)
    root = getattr(stage.sink, "root", None)
    if root is not None:
        stage = replace(stage, sink=replace(stage.sink, root=f"{root}-without-{digest}"))
    for i, task in enumerate(tasks):
        if task.source is not None:
            source = task.source
            tasks[i] = replace(task, source=replace(source, input=f"{source.input}+without:{digest}"))
    return stage, tasks
