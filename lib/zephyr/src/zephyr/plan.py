"""Dataset -> Plan: fuse per-item ops into stages, cut a stage at every shuffle.

A stage is data: its index, its input (source shards, or the output of a shuffle), the fused
chain of per-item ops every shard runs, and its sink (collect results, or scatter for the next
stage). `describe()` prints it; `--dry-run` prints it for every pipeline a script executes.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from zephyr import ops as op
from zephyr.errors import PlanError
from zephyr.sources import SourceShard, resolve_source

__all__ = ["Plan", "Stage", "compile_plan"]


@dataclass(frozen=True)
class Stage:
    """One round of tasks, one per shard, each running the same fused op chain."""

    index: int
    ops: tuple
    num_shards: int
    input: Any  # a tuple of SourceShard for source stages; a shuffle reader otherwise
    sink: Any = None  # None: results go back to the driver; otherwise a shuffle writer
    input_label: str = ""

    def describe(self) -> str:
        chain = " -> ".join([self.input_label] + [o.describe() for o in self.ops])
        sink = f" => {self.sink.describe()}" if self.sink is not None else ""
        return f"stage {self.index} [{self.num_shards} shards]: {chain}{sink}"

    def shard_label(self, shard: int) -> str:
        if isinstance(self.input, tuple):
            return self.input[shard].label
        return f"{self.input_label} shard {shard}"


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    fingerprint: str = field(default="")

    @property
    def num_shards(self) -> int:
        return self.stages[-1].num_shards

    def describe(self) -> str:
        head = f"Plan: {len(self.stages)} stage(s), {self.num_shards} output shard(s)"
        return "\n".join([head] + ["  " + s.describe() for s in self.stages])


def compile_plan(dataset) -> Plan:
    """Resolve the source and fuse ops into stages; validates writers against shard counts."""
    shards: Sequence[SourceShard] = resolve_source(dataset.source)
    stage = Stage(
        index=0,
        ops=tuple(dataset.ops),
        num_shards=len(shards),
        input=tuple(shards),
        input_label=dataset.source.describe(),
    )
    stages = (stage,)
    for s in stages:
        _check_writers(s)
        _check_load_file_extensions(s)
    return Plan(stages)


def _check_writers(stage: Stage) -> None:
    for record in stage.ops:
        if isinstance(record, (op.WriteJsonl, op.WriteParquet)) and stage.num_shards > 1:
            if not op.has_shard_field(record.pattern):
                raise PlanError(
                    f"Output pattern must contain '{{shard}}' when writing {stage.num_shards} shards; "
                    f"got {record.pattern!r} (e.g. 'out/part-{{shard:05d}}-of-{{total:05d}}.jsonl.zst')"
                )


def _check_load_file_extensions(stage: Stage) -> None:
    """Fail before any task runs when `load_file()` reads paths straight from `from_files`."""
    if not stage.ops or not isinstance(stage.ops[0], op.LoadFile) or not isinstance(stage.input, tuple):
        return
    from zephyr.readers import format_for

    for shard in stage.input:
        for path in shard.items:
            if isinstance(path, str):
                format_for(path)
