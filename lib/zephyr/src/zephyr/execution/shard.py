"""Runs one stage on one shard: the fused generator chain, writers, skip_existing, error context.

This is the function every backend executes. It is pure given (stage program, shard task):
it reads only its inputs, writes only its outputs (atomically), and returns a small result.
"""

from __future__ import annotations

import itertools
import operator
import time
import traceback
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from functools import singledispatch
from typing import Any

from zephyr import counters
from zephyr.plan import ops as op
from zephyr.aggregate.grouped import PartialAggregate
from zephyr.engine.frame import Pieces
from zephyr.execution.engine_ops import load_batches, map_batches_items, write_jsonl_pieces
from zephyr.errors import ShardError, is_transient_storage_error
from zephyr.execution.failed_record import failed_record
from zephyr.execution.replay import numbered
from zephyr.execution.intra_shard import OriginatedOps, run_split, split_end
from zephyr.expr.presence import watched
from zephyr.io.files import exists, file_size
from zephyr.io.binary import write_binary_file
from zephyr.io.jsonl import write_jsonl_file
from zephyr.engine.parquet import write_parquet_pieces
from zephyr.io.parquet import write_parquet_file
from zephyr.io.tokens import write_tokens_file
from zephyr.io.json_records import JsonLines
from zephyr.execution.provenance import claim_output, existing_output_kept, record_output_sizes
from zephyr.shuffle.join import BoundJoin, merge_join
from zephyr.execution.loaders import read_path
from zephyr.execution.memory import task_budget
from zephyr.execution.usage import measuring
from zephyr.shuffle import origin as origins
from zephyr.plan.join_shuffled import TwoSided
from zephyr.plan.ops import watch_points
from zephyr.tasks import ShardResult, ShardTask, StageProgram
from zephyr.io.vortex import write_vortex_file

__all__ = ["ShardResult", "ShardTask", "StageProgram", "run_shard"]


@dataclass(frozen=True)
class _Context:
    shard: int
    num_shards: int
    input_path: str | None = None  # the one input file of a source shard, for {basename}
    source: Any = None  # provenance.ShardSource: what skip_existing outputs are made from
    codes: dict = field(default_factory=dict)  # op index -> code fingerprint of skip_existing writers
    outputs: dict = field(default_factory=dict)  # what the writers made: path -> {"bytes", "records"}
    claimed: dict = field(default_factory=dict)  # skip_existing outputs -> the sidecar this task wrote


def run_shard(program: StageProgram, task: ShardTask) -> ShardResult:
    """Run `program` over `task`'s input; failures become ShardError naming the shard (marked
    `transient` for a storage error worth retrying). The result carries what the task used
    (`zephyr.execution.usage`); `zephyr.task_memory()` is the task's budget meanwhile."""
    with measuring() as measured, task_budget(task.memory):
        result = _run_shard(program, task)
    result.usage = measured.usage
    return result


def _run_shard(program: StageProgram, task: ShardTask) -> ShardResult:
    start = time.perf_counter()
    ctx = _Context(task.shard, task.num_shards, task.input_path if program.reader is None else None, task.source, dict(program.codes))
    counted, split = None, False
    # a stage between two shuffles carries its items' origins from one to the next
    tracked = program.reader is not None and program.sink is not None and program.reader.carries_origins
    origin = origins.Origin() if tracked else None
    with counters.collecting(f"stage{task.stage}") as counts, origins.tracking(origin):
        try:
            start_at, stream = _resume_point(program.ops, ctx)
            if stream is None:
                stream = program.reader.read(task, origin) if program.reader is not None else iter(task.items)
                start_at, stream = _load(program.ops, stream, ctx, program.sink, task.memory)
                writes_jsonl = start_at < len(program.ops) and isinstance(program.ops[start_at], op.WriteJsonl)
                stream, counted = _counted(stream, writes_jsonl)
            stream, split = _apply_ops(program.ops, start_at, stream, ctx, task)
            if program.sink is None:
                items = list(stream)
                summary = None
            else:
                items = None
                summary = program.sink.write(stream, task, origins.current())
        except Exception as e:
            transient = _judged(e, lambda: is_transient_storage_error(e), False)  # here: the traceback does not survive pickling
            record = None
            if counted is not None and not transient and not split:  # a split shard's reader runs ahead
                record = _judged(e, lambda: failed_record(e, program.ops, start_at, next(counted), lambda: _numbered(program, task),
                                                          lambda: _reread(program, task, ctx)), None)
            raise ShardError(task.stage, task.shard, task.label, type(e).__name__, str(e), traceback.format_exc(), transient,
                             record) from e
    return ShardResult(
        shard=task.shard,
        items=items,
        counters=dict(counts),
        num_items=len(items) if items is not None else 0,
        elapsed=time.perf_counter() - start,
        summary=summary,
        items_in=next(counted) if counted is not None else 0,
        outputs=ctx.outputs,
    )


_LOADERS = op.LOAD_OPS


def _judged(error: Exception, judge, default) -> Any:
    """`judge()` (what the failure means, which record it hit), or `default` if judging fails
    itself: the error being reported must reach the driver as it is, never a second error of
    ours in its place (that one is noted on the error, so its traceback shows it)."""
    try:
        return judge()
    except Exception as second:  # noqa: BLE001 - e.g. an import that failed while handling a MemoryError
        error.add_note(f"(zephyr could not judge this failure: {type(second).__name__}: {second})")
        return default


def _apply_ops(ops: tuple, start_at: int, stream: Iterator, ctx: _Context, task: ShardTask) -> tuple[Iterator, bool]:
    """The ops from `start_at` on, chained; with `task.split > 1` the per-item ones that come
    first run in that many processes (`zephyr.execution.intra_shard`). Also says whether they did.
    A split stage between two shuffles pairs its items with their origins (the reading runs
    ahead in a thread of its own) and publishes its outputs' in an `Origin` of their own."""
    end = split_end(ops, start_at) if task.split > 1 and not isinstance(stream, Pieces) else start_at
    watches = watch_points(ops[start_at:])  # columns no record had: counted (`zephyr.expr.presence`)
    feed = origins.current()
    if end > start_at:  # the chunks' processes see parts of the shard: the run that starts it is watched here
        stream = watched(stream, watches.get(0, ()))
    if end > start_at and feed is not None:
        chunks = run_split((OriginatedOps(ops[start_at:end]),), origins.paired(stream, feed), task.split, f"stage{task.stage}")
        origins.use(published := origins.Origin())
        stream = origins.unpaired(chunks, published)
    elif end > start_at:
        stream = run_split(ops[start_at:end], stream, task.split, f"stage{task.stage}")
    for index in range(end, len(ops)):
        if index in ctx.codes and ctx.source is not None:
            path = _output_path(ops[index], ctx)
            ctx.claimed[path] = claim_output(ops[index], path, ctx.source, ctx.codes[index])
        if index - start_at in watches:
            stream = watched(stream, watches[index - start_at])
        stream = _apply(ops[index], stream, ctx)
    return stream, end > start_at


def _numbered(program: StageProgram, task: ShardTask) -> Iterator:
    """The shard's input again, each record numbered, as its loader reads it before its folded ops
    (for `failed_record`)."""
    return numbered(program.ops, program.reader.read(task) if program.reader is not None else iter(task.items))


def _reread(program: StageProgram, task: ShardTask, ctx: _Context) -> Iterator:
    """The shard's records again, as its first per-item op saw them (for `failed_record`)."""
    stream = program.reader.read(task) if program.reader is not None else iter(task.items)
    return iter(_load(program.ops, stream, ctx, program.sink, task.memory)[1])


def _load(ops: tuple, stream: Iterator, ctx: _Context, sink: Any = None, memory: int | None = None) -> tuple[int, Iterator]:
    """Apply the stage's leading loaders: the records they yield are the stage's items in.
    Where the stage starts in the engine (`zephyr.execution.engine_ops`), also the ops that run there."""
    batched = load_batches(ops, stream, sink, memory)
    if batched is not None:
        return batched
    start = 0
    while start < len(ops) and isinstance(ops[start], _LOADERS):
        stream = _apply(ops[start], stream, ctx)
        start += 1
    return start, stream


def _counted(stream: Iterator, writes_jsonl: bool = False) -> tuple[Iterator, Iterator[int]]:
    """`stream` unchanged, and a counter whose next value is how many items it has yielded.

    Zipped with `itertools.count` in C: ~40 ns per item, where a Python-level wrapper costs
    three times that (benchmarks/bench_status.py). A shuffle's `JsonLines` is handed on as it
    is only to a JSONL writer (`writes_jsonl`), which copies its bytes and counts them; anything
    else gets its plain iterator of records, counted like any stream.
    """
    if isinstance(stream, Pieces):
        return stream, stream.counted()
    if isinstance(stream, JsonLines):
        if writes_jsonl:
            return stream, stream.copied()
        stream = iter(stream)
    counter = itertools.count()
    return map(_first, zip(stream, counter)), counter


_first = operator.itemgetter(0)


def _resume_point(ops: tuple, ctx: _Context) -> tuple[int, Iterator | None]:
    """skip_existing: start after the last writer whose output already exists, made from this
    shard's input (`zephyr.execution.provenance`), skipping all upstream."""
    for i in range(len(ops) - 1, -1, -1):
        record = ops[i]
        if isinstance(record, op.WRITE_OPS) and record.skip_existing:
            path = _output_path(record, ctx)
            kept = existing_output_kept(path, ctx.source, ctx.codes.get(i, "")) if ctx.source is not None else exists(path)
            if kept:
                counters.increment("zephyr/shards_skipped_existing")
                for written in op.written_files(record, path):  # kept: counted by the run that wrote them
                    ctx.outputs[written] = {"bytes": file_size(written), "records": None}
                return i + 1, iter([path])
    return 0, None


@singledispatch
def _apply(record: Any, stream: Iterator, ctx: _Context) -> Iterator:
    raise TypeError(f"no implementation for op {type(record).__name__}")


@_apply.register(op.Map)
@_apply.register(op.Filter)
@_apply.register(op.FilterExpr)
@_apply.register(op.Select)
@_apply.register(op.FlatMap)
@_apply.register(op.WithColumns)
@_apply.register(PartialAggregate)
def _(record, stream, ctx):
    return record.apply(stream)


@_apply.register
def _(record: op.MapBatches, stream, ctx):
    return map_batches_items(record, stream)


@_apply.register
def _(record: op.MapShard, stream, ctx):
    result = record.fn(stream, op.ShardInfo(ctx.shard, ctx.num_shards)) if record.with_info else record.fn(stream)
    if not isinstance(result, Iterable):
        raise TypeError(f"map_shard fn {op.callable_name(record.fn)} must return an iterable, got {type(result).__name__}")
    return iter(result)


@_apply.register
def _(record: op.Window, stream, ctx):
    return _windows(stream, record.size)


@_apply.register
def _(record: op.WindowBy, stream, ctx):
    return _fold_windows(stream, record.folder_fn, record.initial_state)


@_apply.register
def _(record: op.TakePerShard, stream, ctx):
    return itertools.islice(stream, record.n)


@_apply.register(op.LoadJsonl)
@_apply.register(op.LoadParquet)
@_apply.register(op.LoadVortex)
@_apply.register(op.LoadFile)
@_apply.register(op.LoadWarc)
def _(record, stream, ctx):
    return itertools.chain.from_iterable(read_path(item, record) for item in stream)


@_apply.register
def _(record: op.WriteJsonl, stream, ctx):
    path = _output_path(record, ctx)
    if isinstance(stream, Pieces):
        return _written(path, lambda: write_jsonl_pieces(stream, path), ctx)
    return _written(path, lambda: write_jsonl_file(stream, path, remove_stale=False), ctx)


@_apply.register
def _(record: op.WriteParquet, stream, ctx):
    path = _output_path(record, ctx)
    if isinstance(stream, Pieces):
        return _written(path, lambda: write_parquet_pieces(stream, path, record.schema), ctx)
    return _written(path, lambda: write_parquet_file(stream, path, record.schema, remove_stale=False), ctx)


@_apply.register
def _(record: op.WriteVortex, stream, ctx):
    path = _output_path(record, ctx)
    return _written(path, lambda: write_vortex_file(stream, path, record.schema, remove_stale=False), ctx)


@_apply.register
def _(record: op.WriteBinary, stream, ctx):
    path = _output_path(record, ctx)
    return _written(path, lambda: write_binary_file(stream, path, remove_stale=False), ctx)


@_apply.register
def _(record: op.WriteTokens, stream, ctx):
    path = _output_path(record, ctx)
    return _written(path, lambda: write_tokens_file(stream, path, field=record.field, dtype=record.dtype,
                                                    remove_stale=False), ctx, op.written_files(record, path))


def _output_path(record, ctx: _Context) -> str:
    return op.shard_output_path(record.pattern, ctx.shard, ctx.num_shards, ctx.input_path)


@_apply.register
def _(record: BoundJoin, stream, ctx):
    right: Iterator = iter(record.right_items[ctx.shard])
    right_ctx = _Context(ctx.shard, ctx.num_shards)
    for right_op in record.right_ops:
        right = _apply(right_op, right, right_ctx)
    join = record.record
    return merge_join(stream, right, join.left_key, join.right_key, join.how, ctx.shard, join.combiner)


@_apply.register
def _(record: TwoSided, stream, ctx):
    """Stage 0 of a co-partitioned join's shuffle: the shard's own side's chain, items tagged."""
    side, ops = (0, record.left_ops) if ctx.shard < record.num_left else (1, record.right_ops)
    if side:
        ctx = replace(ctx, shard=ctx.shard - record.num_left, num_shards=record.num_right)
    else:
        ctx = replace(ctx, num_shards=record.num_left)
    for one in ops:
        stream = _apply(one, stream, ctx)
    return record.tagged(side, stream)


def _windows(stream: Iterator, size: int) -> Iterator[list]:
    while chunk := list(itertools.islice(stream, size)):
        yield chunk


def _fold_windows(stream: Iterator, folder_fn, initial_state) -> Iterator[list]:
    """Windows closed by `folder_fn(state, item) -> (stay, state)`: an item that does not
    stay opens the next window, whose state is the fold of the initial state with it."""
    window: list = []
    state = initial_state
    for item in stream:
        stay, new_state = folder_fn(state, item)
        if stay or not window:
            window.append(item)
            state = new_state
        else:
            yield window
            window = [item]
            _, state = folder_fn(initial_state, item)
    if window:
        yield window


def _written(path: str, write, ctx: _Context, files: list[str] | None = None) -> Iterator[str]:
    """Write, count, and note the size and records of the output (and of the `files` written
    beside it) for the run record (`zephyr verify`)."""
    count = write()
    counters.increment("zephyr/records_written", count)
    for written in files or [path]:
        ctx.outputs[written] = {"bytes": file_size(written), "records": count}
    if path in ctx.claimed:  # skip_existing: a later run keeps these files only at these sizes
        record_output_sizes(path, ctx.claimed[path], {written: ctx.outputs[written]["bytes"] for written in files or [path]})
    yield path
