"""The unit of work: what the planner cuts a stage into, what a backend runs, what comes back.

Small descriptors only (never the data): a `ShardTask` names what one task reads, a
`StageProgram` is what every task of a stage shares, a `ShardResult` is what a task returns.
They sit below the planner, the shuffle and the runner, which all build or read them.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["ShardInfo", "ShardResult", "ShardTask", "StageProgram"]


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
