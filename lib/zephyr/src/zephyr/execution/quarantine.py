"""Quarantine: a shard that fails on every attempt is set aside so that the rest of the run goes on.

With `on_shard_failure="quarantine"` (a backend option; `zephyr --on-shard-failure=quarantine`)
a shard whose user code or input fails on each of its attempts (`max_user_retries` + 1), or
whose worker dies (or whose transient storage errors recur) more than `max_infra_retries` times,
is not the end of the run: `StageLoop` hands it here with its error and goes on. A quarantined shard contributes nothing downstream:

- a writer shard leaves no output (writes are atomic: nothing was renamed into place), and
  an output an earlier run left at its path is removed (`remove_outputs`), so the directory
  never mixes an old run's file for this shard with this run's files for the others;
- a scatter map shard has no manifest, so no reduce reads its runs (the reducers read only the
  runs that manifests list), and the other map shards' manifests stay for a rerun;
- every later stage's work is partial, so it is kept apart from complete work: a later scatter
  writes under its own scratch root (`<root>-without-<digest>`) and a later skip_existing
  writer's provenance names what was missing, so a rerun with the poison fixed recomputes them
  instead of reusing outputs made without the quarantined shards.

A stage may set aside at most `max_quarantined` of its shards (a backend option: a count, or a
fraction of the stage's shards, at least one; default 10%): past that, most likely the code and
not the input is at fault, so the run stops at once with `QuarantineLimitError` instead of
spending a cluster on shards that all fail.

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
from zephyr.io.files import url_to_fs
from zephyr.plan import ops as op
from zephyr.tasks import ShardTask

__all__ = ["DEFAULT_MAX_QUARANTINED", "ON_SHARD_FAILURE", "Quarantine", "QuarantineLimitError", "QuarantinedShard",
           "QuarantinedShardsError", "check_max_quarantined", "check_on_shard_failure", "quarantine_limit"]

logger = logging.getLogger("zephyr")

ON_SHARD_FAILURE = ("fail", "quarantine")
MAX_TRACEBACK = 4000  # characters of each quarantined shard's traceback kept (its end: where it failed)
SHOWN = 20  # quarantined shards listed in an error message
DEFAULT_MAX_QUARANTINED = 0.1  # of a stage's shards (at least one)


def check_on_shard_failure(value: str) -> str:
    """`value` if it is a valid `on_shard_failure`, else ValueError naming the choices."""
    if value not in ON_SHARD_FAILURE:
        raise ValueError(f"on_shard_failure must be one of {', '.join(map(repr, ON_SHARD_FAILURE))}, got {value!r}")
    return value


def check_max_quarantined(value: int | float | None) -> int | float | None:
    """`value` if it is a valid `max_quarantined` (None: no limit; an int >= 0: shards; a float
    in (0, 1]: a fraction of a stage's shards), else ValueError saying what is accepted."""
    if value is None or (isinstance(value, int) and not isinstance(value, bool) and value >= 0):
        return value
    if isinstance(value, float) and 0 < value <= 1:
        return value
    raise ValueError(f"max_quarantined must be None, a number of shards >= 0, or a fraction in (0, 1], got {value!r}")


def quarantine_limit(max_quarantined: int | float | None, num_shards: int) -> int | None:
    """How many of a stage's `num_shards` shards may be quarantined (None: any number)."""
    if max_quarantined is None or isinstance(max_quarantined, int):
        return max_quarantined
    return max(1, int(max_quarantined * num_shards))


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
    `.results` holds the results the run handed out, in shard order (a writer's paths), which
    `list(execution)` would otherwise lose when this is raised at its end.
    """

    def __init__(self, shards: list[dict], results: list | None = None):
        self.shards = shards
        self.results = results if results is not None else []
        lines = [QuarantinedShard(**s).describe() for s in shards[:SHOWN]]
        more = [f"... and {len(shards) - SHOWN} more (see the run record)"] if len(shards) > SHOWN else []
        super().__init__(
            f"{len(shards)} shard(s) quarantined after failing on every attempt; the other shards finished and their "
            "outputs are complete. Fix the input or the code and run again: only the unfinished shards run.\n  "
            + "\n  ".join(lines + more)
        )

    def __reduce__(self):  # with `.results`: the error may come back from a Ray task (a Marin step)
        return (QuarantinedShardsError, (self.shards, self.results))


class QuarantineLimitError(RuntimeError):
    """More of a stage's shards failed on every attempt than `max_quarantined` allows: the run
    stopped (`.shards`: those set aside before; the cause: the error of the one past the limit)."""

    def __init__(self, stage: int, num_shards: int, limit: int, shards: list[dict], last: str):
        self.shards = shards
        self._args = (stage, num_shards, limit, shards, last)
        super().__init__(
            f"stage {stage}: {len(shards) + 1} of its {num_shards} shards failed on every attempt, more than "
            f"max_quarantined allows ({limit}); this looks like a fault in the code, not in a few inputs, so the run "
            f"stopped. The last one: {last}. Raise max_quarantined (None: no limit) if these inputs are really bad."
        )

    def __reduce__(self):
        return (QuarantineLimitError, self._args)


class Quarantine:
    """The shards one run set aside. `on_add` (the run's status) hears of each as it happens;
    `max_quarantined` bounds them per stage (`quarantine_limit`)."""

    def __init__(self, on_add: Callable[[int, dict], None] | None = None,
                 max_quarantined: int | float | None = DEFAULT_MAX_QUARANTINED):
        self.shards: list[QuarantinedShard] = []
        self._on_add = on_add
        self.max_quarantined = check_max_quarantined(max_quarantined)

    def __bool__(self) -> bool:
        return bool(self.shards)

    def add(self, task: ShardTask, error: ShardError, attempts: int) -> QuarantinedShard:
        """Set the shard aside, or raise QuarantineLimitError when its stage is past the limit."""
        limit = quarantine_limit(self.max_quarantined, task.num_shards)
        before = [q.to_dict() for q in self.shards if q.stage == task.stage]
        if limit is not None and len(before) >= limit:
            last = f"shard {task.shard} (source: {task.label}): {error.error_type}: {error.error_message[:300]}"
            raise QuarantineLimitError(task.stage, task.num_shards, limit, before, last) from error
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


def remove_outputs(ops: tuple, task: ShardTask, input_path: str | None) -> None:
    """Remove the files at the quarantined `task`'s output paths (an earlier run's, or an earlier
    writer's of the same stage), for every writer of its stage but skip_existing ones (those
    remove a stale output themselves before writing, and keep a current one). A failure is
    logged: the report names the shard anyway."""
    for record in ops:
        if not isinstance(record, op.WRITE_OPS) or record.skip_existing:
            continue
        try:
            path = op.shard_output_path(record.pattern, task.shard, task.num_shards, input_path)
            for written in op.written_files(record, path):
                fs, fs_path = url_to_fs(written)
                if fs.exists(fs_path):
                    fs.rm_file(fs_path)
                    logger.warning("zephyr: removed %s: quarantined shard %d of stage %d contributes no output",
                                   written, task.shard, task.stage)
        except Exception as e:  # noqa: BLE001 - cleanup of an old file must not end the run
            logger.warning("zephyr: could not remove the earlier output of quarantined shard %d: %s: %s",
                           task.shard, type(e).__name__, e)


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
