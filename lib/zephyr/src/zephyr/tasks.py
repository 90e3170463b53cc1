"""The unit of work: what the planner cuts a stage into, what a backend runs, what comes back.

Small descriptors only (never the data): a `ShardTask` names what one task reads, a
`StageProgram` is what every task of a stage shares, a `ShardResult` is what a task returns.
They sit below the planner, the shuffle and the runner, which all build or read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ShardInfo", "ShardResult", "ShardTask", "StageProgram", "TaskUsage"]


@dataclass(frozen=True)
class ShardInfo:
    """What a two-parameter `map_shard` function receives besides the items."""

    shard_idx: int
    total_shards: int


@dataclass(frozen=True)
class StageProgram:
    """What every task of a stage shares (shipped once per stage): the ops, the reader, the sink."""

    index: int
    ops: tuple
    reader: Any = None  # None: the task's own items are the input; else reader.read(task) -> iterator
    sink: Any = None  # None: return items; else sink.write(stream, task) -> summary
    codes: tuple = ()  # (op index, code fingerprint) of each skip_existing writer (zephyr.execution.provenance)


@dataclass(frozen=True)
class ShardTask:
    """What one task receives: small descriptors, never the data itself."""

    stage: int
    shard: int
    num_shards: int
    label: str
    items: tuple = ()
    memory: int | None = None  # the task's memory budget in bytes, for sizing buffers
    input_path: str | None = None  # the from_files input file of a source shard, for {basename}
    source: Any = None  # what the shard reads (provenance.ShardSource), for skip_existing writers
    split: int = 1  # processes that may share the shard's per-item ops (zephyr.execution.intra_shard)


@dataclass(frozen=True)
class TaskUsage:
    """What one task used, measured around it in its worker (`zephyr.execution.usage`).

    `cpu_s`: user+system CPU seconds: the whole process's when the task had its process to
    itself (a Ray worker, the sync backend), else (threadpool tasks that overlapped) only the
    task's own thread. `peak_rss`: the process's resident-set high-water mark during the task,
    in bytes; `rss_rise`: how far it rose above the resident set when the task started.
    `shared`: other tasks ran in the same process meanwhile, so `peak_rss` is theirs too.
    """

    cpu_s: float = 0.0
    peak_rss: int = 0
    rss_rise: int = 0
    shared: bool = False


@dataclass
class ShardResult:
    shard: int
    items: list | None
    counters: dict = field(default_factory=dict)
    num_items: int = 0
    elapsed: float = 0.0
    summary: Any = None
    items_in: int = 0  # records entering the stage's ops (after its loaders); 0 for resumed shards
    outputs: dict = field(default_factory=dict)  # files its writers made: path -> {"bytes", "records"} (None: kept, not counted)
    usage: TaskUsage | None = None  # measured in the worker; None for resumed shards
