"""Runs one stage on one shard: the fused generator chain, writers, skip_existing, error context.

This is the function every backend executes. It is pure given (stage program, shard task):
it reads only its inputs, writes only its outputs (atomically), and returns a small result.
"""

from __future__ import annotations

import itertools
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from functools import singledispatch
from typing import Any

from zephyr import counters
from zephyr import ops as op
from zephyr.errors import ShardError, is_transient_storage_error
from zephyr.io.files import exists
from zephyr.io.jsonl import write_jsonl_file
from zephyr.io.parquet import write_parquet_file
from zephyr.join import BoundJoin, merge_join
from zephyr.readers import FileFormat, read_path

__all__ = ["ShardResult", "ShardTask", "StageProgram", "run_shard"]


@dataclass(frozen=True)
class StageProgram:
    """What every task of a stage shares (shipped once per stage): the ops, the reader, the sink."""

    index: int
    ops: tuple
    reader: Any = None  # None: the task's own items are the input; else reader.read(task) -> iterator
    sink: Any = None  # None: return items; else sink.write(stream, task) -> summary


@dataclass(frozen=True)
class ShardTask:
    """What one task receives: small descriptors, never the data itself."""

    stage: int
    shard: int
    num_shards: int
    label: str
    items: tuple = ()
    memory: int | None = None  # the task's memory budget in bytes, for sizing buffers


@dataclass
class ShardResult:
    shard: int
    items: list | None
    counters: dict = field(default_factory=dict)
    num_items: int = 0
    elapsed: float = 0.0
    summary: Any = None


@dataclass(frozen=True)
class _Context:
    shard: int
    num_shards: int


def run_shard(program: StageProgram, task: ShardTask) -> ShardResult:
    """Run `program` over `task`'s input; failures become ShardError naming the shard (marked
    `transient` for a storage error worth retrying)."""
    start = time.perf_counter()
    ctx = _Context(task.shard, task.num_shards)
    with counters.collecting() as counts:
        try:
            start_at, stream = _resume_point(program.ops, ctx)
            if stream is None:
                stream = program.reader.read(task) if program.reader is not None else iter(task.items)
            for record in program.ops[start_at:]:
                stream = _apply(record, stream, ctx)
            if program.sink is None:
                items = list(stream)
                summary = None
            else:
                items = None
                summary = program.sink.write(stream, task)
        except Exception as e:
            transient = is_transient_storage_error(e)  # here: the traceback does not survive pickling
            error = ShardError(task.stage, task.shard, task.label, type(e).__name__, str(e), traceback.format_exc(), transient)
            raise error from e
    return ShardResult(
        shard=task.shard,
        items=items,
        counters=dict(counts),
        num_items=len(items) if items is not None else 0,
        elapsed=time.perf_counter() - start,
        summary=summary,
    )


def _resume_point(ops: tuple, ctx: _Context) -> tuple[int, Iterator | None]:
    """skip_existing: start after the last writer whose output already exists (skipping all upstream)."""
    for i in range(len(ops) - 1, -1, -1):
        record = ops[i]
        if isinstance(record, (op.WriteJsonl, op.WriteParquet)) and record.skip_existing:
            path = op.output_path(record.pattern, ctx.shard, ctx.num_shards)
            if exists(path):
                counters.increment("zephyr/shards_skipped_existing")
                return i + 1, iter([path])
    return 0, None


@singledispatch
def _apply(record: Any, stream: Iterator, ctx: _Context) -> Iterator:
    raise TypeError(f"no implementation for op {type(record).__name__}")


@_apply.register
def _(record: op.Map, stream, ctx):
    return map(record.fn, stream)


@_apply.register
def _(record: op.Filter, stream, ctx):
    return filter(record.predicate, stream)


@_apply.register
def _(record: op.FlatMap, stream, ctx):
    return itertools.chain.from_iterable(map(record.fn, stream))


@_apply.register
def _(record: op.MapShard, stream, ctx):
    result = record.fn(stream)
    if not isinstance(result, Iterable):
        raise TypeError(f"map_shard fn {op.callable_name(record.fn)} must return an iterable, got {type(result).__name__}")
    return iter(result)


@_apply.register
def _(record: op.Window, stream, ctx):
    return _windows(stream, record.size)


@_apply.register
def _(record: op.TakePerShard, stream, ctx):
    return itertools.islice(stream, record.n)


@_apply.register
def _(record: op.LoadJsonl, stream, ctx):
    return itertools.chain.from_iterable(read_path(p, FileFormat.JSONL, record.on_bad_record) for p in stream)


@_apply.register
def _(record: op.LoadParquet, stream, ctx):
    return itertools.chain.from_iterable(read_path(p, FileFormat.PARQUET, columns=record.columns) for p in stream)


@_apply.register
def _(record: op.LoadFile, stream, ctx):
    return itertools.chain.from_iterable(read_path(p, None, record.on_bad_record) for p in stream)


@_apply.register
def _(record: op.WriteJsonl, stream, ctx):
    path = op.output_path(record.pattern, ctx.shard, ctx.num_shards)
    return _written(path, lambda: write_jsonl_file(stream, path, remove_stale=False))


@_apply.register
def _(record: op.WriteParquet, stream, ctx):
    path = op.output_path(record.pattern, ctx.shard, ctx.num_shards)
    return _written(path, lambda: write_parquet_file(stream, path, record.schema, remove_stale=False))


@_apply.register
def _(record: BoundJoin, stream, ctx):
    right: Iterator = iter(record.right_items[ctx.shard])
    right_ctx = _Context(ctx.shard, ctx.num_shards)
    for right_op in record.right_ops:
        right = _apply(right_op, right, right_ctx)
    join = record.record
    return merge_join(stream, right, join.left_key, join.right_key, join.how, ctx.shard)


def _windows(stream: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(stream, size)):
        yield chunk


def _written(path: str, write) -> Iterator[str]:
    count = write()
    counters.increment("zephyr/records_written", count)
    yield path
