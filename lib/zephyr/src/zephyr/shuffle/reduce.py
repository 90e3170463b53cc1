"""Scatter and gather: the stage boundary behind group_by, deduplicate, reshard and reduce.

Map side (`scatter.ScatterSink`): records are partitioned by a batch-computed 64-bit hash of
their key (`shuffle_keys`), buffered as Arrow columns when they convert exactly (`columnar`)
or as pickles otherwise, sorted, combined, and spilled as run files (`runs`), with a manifest
per map shard that marks it finished (so a rerun resumes at the reduce stage).

Driver (`ShuffleReader.tasks`): the manifests' packed offsets become a compact `RunIndex`;
each partition becomes one reduce task, or several key ranges when it is far larger than the
median (skew); the largest partitions are reported on the progress bar and in the summary.

Reduce side (`ShuffleReader.read`): a task reads its byte range of every run. When every run
is columnar with one schema, runs are merged in hash-range slices sized to the task's memory,
each sorted in one go with NumPy/Arrow (`slices.merge_slices`), and only the rows handed on
are turned back into Python; otherwise
records are merged one at a time (`heapq.merge`). Either way the order is (hash, key bytes,
sort value, origin): deduplicate keeps the first item in the pipeline's input (by input
shard, position: `zephyr.shuffle.origin`), `sort_by` orders items within a group, and
columnar and pickled runs give the same output. When there are more runs than half the task's memory allows open at once, groups of
them are merged into task-local intermediate runs first (`zephyr-merge-<pid>@<host>-*` in the
temp dir, swept by a later run if the task is killed), as many passes as needed. Everything
lives under `<scratch>/<stage fingerprint>/` and is removed after a successful run.
"""

from __future__ import annotations

import heapq
import inspect
import itertools
import os
import pickle
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephyr import counters
from zephyr.shuffle import merge as columnar_merge
from zephyr.shuffle.columnar import batch_rows, conform, dumps, unify_schemas
from zephyr.io.temporaries import make_temp_dir
from zephyr.shuffle.run_index import ReduceInput, ReduceTasks, RunIndex
from zephyr.shuffle.runs import compression_for, read_arrow_range, read_pickle_range, write_pickle_frames
from zephyr.shuffle.scatter import DEFAULT_BUFFER, HashPartition, RoundRobin, ScatterSink, keep_first, unorderable_sort_by
from zephyr.shuffle.slices import merge_slices
from zephyr.shuffle.keys import key_bytes, partition_of
from zephyr.dedup import report
from zephyr.shuffle.origin import SHIFT, Origin, published
from zephyr.tasks import ShardTask

__all__ = [
    "Concatenate",
    "FirstPerKey",
    "HashPartition",
    "ReduceGroups",
    "RoundRobin",
    "ScatterSink",
    "ShuffleReader",
    "keep_first",
    "key_bytes",
    "merge_fan_in",
    "partition_of",
]

_MEMORY_PER_OPEN_RUN = 2 * 1024 * 1024  # one decoded batch (<= BATCH_BYTES) or frame per run being merged, plus read buffers
MIN_FAN_IN = 4


class GroupMode:
    """How the reduce side turns merged records into items: `apply` on pickled records
    `(h, kb, sort value, origin shard, origin pos, pickle((key, item)))`, `apply_columnar` on
    sorted tables. With an `origin`, each item is handed on with its origin published there
    (`zephyr.shuffle.origin`)."""

    splittable = True  # may a partition be cut into key ranges?


def _origin_of(record: tuple) -> int:
    return record[3] << SHIFT | record[4]


@dataclass(frozen=True)
class ReduceGroups(GroupMode):
    reducer: Callable[..., Any]

    def apply(self, merged: Iterator[tuple], origin: Origin | None = None) -> Iterator[Any]:
        yields_many = inspect.isgeneratorfunction(self.reducer)
        for _, group in itertools.groupby(merged, key=lambda r: r[1]):
            first = next(group)
            key, item0 = pickle.loads(first[5])
            items = itertools.chain([item0], (pickle.loads(r[5])[1] for r in group))
            result = self.reducer(key, items)
            outputs = result if yields_many else (result,)
            if origin is None or origin_rule(self.reducer) != "group":
                yield from outputs
            else:  # every output of a group comes from its first item
                yield from published(outputs, origin, _origin_of(first))

    def apply_columnar(self, chunks: Iterator[columnar_merge.Chunk], origin: Origin | None = None) -> Iterator[Any]:
        return columnar_merge.reduce_groups(chunks, self.reducer, origin if origin_rule(self.reducer) == "group" else None)


def origin_rule(reducer: Callable[..., Any]) -> str:
    """Where a reducer's outputs get their origins: "group" (its group's first item: any user
    reducer), "own" (it publishes them itself: `deduplicate_fuzzy`'s last, whose group holds a
    block of documents of many origins) or "none" (nothing after it depends on them:
    `deduplicate_fuzzy`'s bucket and component rounds), as its `origins` attribute says."""
    return getattr(getattr(reducer, "func", reducer), "origins", "group")


@dataclass(frozen=True)
class FirstPerKey(GroupMode):
    def apply(self, merged: Iterator[tuple], origin: Origin | None = None) -> Iterator[Any]:
        out = 0
        try:
            for _, group in itertools.groupby(merged, key=lambda r: r[1]):
                first = next(group)
                if origin is not None:
                    origin.value = _origin_of(first)
                out += 1
                yield pickle.loads(first[5])[1]
        finally:  # the deduplicate's documents out (`zephyr.dedup.report`)
            report.count("documents_out", out)

    def apply_columnar(self, chunks: Iterator[columnar_merge.Chunk], origin: Origin | None = None) -> Iterator[Any]:
        return columnar_merge.first_per_key(chunks, origin)


@dataclass(frozen=True)
class Concatenate(GroupMode):
    splittable = False  # reshard(n) promises n shards

    def apply(self, merged: Iterator[tuple], origin: Origin | None = None) -> Iterator[Any]:
        for record in merged:
            if origin is not None:
                origin.value = _origin_of(record)
            yield pickle.loads(record[5])[1]

    def apply_columnar(self, chunks: Iterator[columnar_merge.Chunk], origin: Origin | None = None) -> Iterator[Any]:
        return columnar_merge.concatenate(chunks, origin)


@dataclass(frozen=True)
class ShuffleReader:
    """The input of the stage after a scatter: partition p's ranges from every map shard's runs."""

    num_partitions: int
    mode: GroupMode
    label: str
    sorted_by_value: bool = False
    # why the stage's partitions are never cut into key ranges for skew ('' when they may be):
    # one of its ops sees its shards whole, or an inline sorted_merge_join pairs its shard i
    # with the right side's shard i (`zephyr.plan.compile._kept_whole`)
    kept_whole: str = ""

    def describe(self) -> str:
        return self.label

    @property
    def may_cut(self) -> bool:
        """Whether skew may cut a partition into key ranges, giving the stage more shards than planned."""
        return self.mode.splittable and not self.kept_whole

    def carries_origins(self) -> bool:
        """Whether the items it hands on go on with their origins (`zephyr.shuffle.origin`)."""
        return not isinstance(self.mode, ReduceGroups) or origin_rule(self.mode.reducer) != "none"

    def tasks(self, stage, previous) -> ReduceTasks:
        if previous is None:  # upstream skipped, every output exists: the tasks only find their outputs
            return ReduceTasks(ShardTask(stage.index, i, stage.num_shards, f"{self.label} shard {i}", ())
                               for i in range(stage.num_shards))
        inputs = RunIndex([r.summary for r in previous], self.num_partitions).plan(split=self.may_cut)
        tasks = ReduceTasks(
            ShardTask(stage.index, i, len(inputs), f"{self.label} shard {i} ({inp.describe()})", (inp,))
            for i, inp in enumerate(inputs)
        )
        tasks.largest = inputs.largest
        return tasks

    def read(self, task, origin: Origin | None = None) -> Iterator[Any]:
        """The task's items, merged from every run; with `origin`, each one's origin is published
        there as it is handed on (for the scatter that follows, `zephyr.shuffle.origin`)."""
        if not task.items:  # see `tasks`: nothing upstream ran
            return iter(())
        (inp,) = task.items
        ranges = inp.ranges()
        counters.increment("zephyr/shuffle_bytes_read", sum(r[5] - r[4] for r in ranges))
        fan_in = merge_fan_in(task.memory)
        if all(r[2] == "arrow" for r in ranges):
            chunks = _ColumnarMerge(inp, fan_in, slice_budget(task.memory)).chunks(ranges)
            if chunks is not None:
                return self.mode.apply_columnar(chunks, origin)
        return self._read_pickled(inp, ranges, fan_in, origin)

    def _read_pickled(self, inp: ReduceInput, ranges: list, fan_in: int, origin: Origin | None) -> Iterator[Any]:
        keyed = not isinstance(self.mode, Concatenate)
        sources = [lambda r=r: _pickled_records(r, inp, keyed) for r in ranges]
        if len(sources) <= fan_in:
            return self.mode.apply(self._merge([s() for s in sources]), origin)
        return self._read_in_passes(sources, fan_in, origin)

    def _merge(self, streams: list[Iterator[tuple]]) -> Iterator[tuple]:
        if self.sorted_by_value:
            return _naming_sort_by(heapq.merge(*streams, key=lambda r: (r[0], r[1], r[2], r[3], r[4])))
        return heapq.merge(*streams, key=lambda r: (r[0], r[1], r[3], r[4]))

    def _read_in_passes(self, sources: list[Callable[[], Iterator[tuple]]], fan_in: int, origin: Origin | None) -> Iterator[Any]:
        """Merge `fan_in` runs at a time into local intermediate runs until few enough remain."""
        workdir = make_temp_dir("merge")  # named for this process: a later run sweeps it if we are killed
        try:
            passes = 0
            while len(sources) > fan_in:
                merged = []
                for i in range(0, len(sources), fan_in):
                    path = os.path.join(workdir, f"pass-{passes}-{i:06d}.bin")
                    with open(path, "wb") as f:
                        length = write_pickle_frames(f, self._merge([s() for s in sources[i : i + fan_in]]))
                    merged.append(lambda path=path, length=length: read_pickle_range(path, 0, length))
                sources = merged
                passes += 1
            counters.increment("zephyr/merge_passes", passes)
            yield from self.mode.apply(self._merge([s() for s in sources]), origin)
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def _naming_sort_by(merged: Iterator[tuple]) -> Iterator[tuple]:
    """`merged`, with a failed comparison of two `sort_by` values (the only values in a record
    that can fail to compare) raised as a TypeError that names `sort_by`."""
    while True:
        try:
            record = next(merged)
        except StopIteration:
            return
        except TypeError as e:
            raise unorderable_sort_by(e) from e
        yield record


def merge_fan_in(memory: int | None) -> int:
    """How many runs a reduce task merges at once: half its memory, one batch per run."""
    budget = memory // 2 if memory else DEFAULT_BUFFER
    return max(MIN_FAN_IN, budget // _MEMORY_PER_OPEN_RUN)


def slice_budget(memory: int | None) -> int:
    """Bytes of runs a reduce task sorts at once (`slices`): a sixteenth of its memory (held, then
    concatenated: twice that, plus a batch per open run, at most a quarter by `merge_fan_in`).
    An eighth peaked 65 MiB higher per Ray worker than the batch-per-round merge on a 2M-document
    dedup at 256 MiB for the same CPU (benchmarks/README.md, section 26)."""
    return (memory if memory else 2 * DEFAULT_BUFFER) // 16


def _in_range(inp: ReduceInput) -> Callable[[int], bool] | None:
    if inp.pieces == 1:
        return None
    lo, hi = inp.lo, inp.hi
    return lambda h: lo <= h and (hi is None or h < hi)


def _pickled_records(rng: tuple, inp: ReduceInput, keyed: bool) -> Iterator[tuple]:
    """One run's part as pickled-path records, whatever its format (the general merge)."""
    path, shard, fmt, head, start, end, schema_len = rng
    keep = _in_range(inp)
    if fmt == "pickle":
        records = read_pickle_range(path, start, end - start)
    else:
        records = (
            (h, kb, sv, shard if s is None else s, pos, dumps((key, item)))
            for batch in read_arrow_range(path, head, start, end, schema_len)
            for h, kb, sv, s, pos, key, item in batch_rows(batch, keyed=keyed)
        )
    return records if keep is None else (r for r in records if keep(r[0]))


class _ColumnarMerge:
    """The merge of Arrow runs (in slices, `slices.merge_slices`); None from `chunks` when their schemas differ."""

    def __init__(self, inp: ReduceInput, fan_in: int, budget: int):
        self.inp = inp
        self.fan_in = fan_in
        self.budget = budget
        self.total = 0

    def _source(self, rng: tuple) -> Iterator[pa.RecordBatch]:
        path, shard, _, head, start, end, schema_len = rng
        lo, hi = self.inp.lo, self.inp.hi
        for batch in read_arrow_range(path, head, start, end, schema_len):
            if self.inp.pieces > 1:
                h = batch.column("h").to_numpy()
                mask = h >= np.uint64(lo)
                if hi is not None:
                    mask &= h < np.uint64(hi)
                if not mask.all():
                    batch = batch.filter(pa.array(mask))
            yield columnar_merge.with_shard(batch, shard)

    def _open(self, sources: list[Iterator[pa.RecordBatch]]) -> tuple[list, pa.Schema] | None:
        """Peek every source's first batch to agree on one schema."""
        opened, schema = [], None
        for source in sources:
            first = next(source, None)
            if first is None:
                continue
            schema = first.schema if schema is None else unify_schemas(schema, first.schema)
            if schema is None:
                return None
            opened.append(itertools.chain([first], source))
        return opened, schema

    def _merged(self, sources: list[Iterator[pa.RecordBatch]]) -> Iterator[columnar_merge.Chunk] | None:
        opened = self._open(sources)
        if opened is None:
            return None
        streams, schema = opened
        if schema is None:
            return iter(())
        conformed = [(conform(b, schema) for b in stream) for stream in streams]
        # the task's bytes (a pass's group holds less: its slices are then smaller than they could be)
        return merge_slices(conformed, schema, self.budget, self.total, self.inp.lo, self.inp.hi)

    def chunks(self, ranges: list) -> Iterator[columnar_merge.Chunk] | None:
        self.total = sum(r[5] - r[4] for r in ranges)
        sources = [lambda r=r: self._source(r) for r in ranges]
        if len(sources) <= self.fan_in:
            return self._merged([s() for s in sources])
        return self._in_passes(sources)

    def _in_passes(self, sources: list) -> Iterator[columnar_merge.Chunk] | None:
        workdir = make_temp_dir("merge")  # named for this process: a later run sweeps it if we are killed
        try:
            passes = 0
            while len(sources) > self.fan_in:
                merged = []
                for i in range(0, len(sources), self.fan_in):
                    chunks = self._merged([s() for s in sources[i : i + self.fan_in]])
                    if chunks is None:
                        shutil.rmtree(workdir, ignore_errors=True)
                        return None
                    path = os.path.join(workdir, f"pass-{passes}-{i:06d}.arrow")
                    merged.append(_write_local_run(path, chunks))
                sources = merged
                passes += 1
            counters.increment("zephyr/merge_passes", passes)
            final = self._merged([s() for s in sources])
        except BaseException:
            shutil.rmtree(workdir, ignore_errors=True)
            raise
        if final is None:
            shutil.rmtree(workdir, ignore_errors=True)
            return None
        return _removing(final, workdir)


def _write_local_run(path: str, chunks: Iterator[columnar_merge.Chunk]) -> Callable[[], Iterator[pa.RecordBatch]]:
    """An intermediate run (one sorted stream with its `s` column); returns how to read it back.

    Its batches hold about `BATCH_BYTES`, as the map side's runs do: the next pass holds one
    batch per open run, and `merge_fan_in` counts on that (8,192 rows of 40 KB documents were
    320 MB); each is taken from the round on its own, so the round is never copied whole.
    Compressed as `compression_for` says: not on a local disk, where LZ4 costs more CPU than
    the bytes it saves (with both changes, an 8M-document dedup's two-pass merge: 105 CPU s to 86)."""
    writer = None
    with open(path, "wb") as f:
        for chunk in chunks:
            if writer is None:
                writer = pa.ipc.new_stream(f, chunk.table.schema, options=pa.ipc.IpcWriteOptions(compression=compression_for(path)))
            for table in chunk.sorted_batches():  # never a sorted copy of the whole round
                writer.write_table(table)
        if writer is not None:
            writer.close()

    def read() -> Iterator[pa.RecordBatch]:
        if os.path.getsize(path):
            with pa.OSFile(path, "rb") as source:
                yield from pa.ipc.open_stream(source)

    return read


def _removing(chunks: Iterator[columnar_merge.Chunk], workdir: str) -> Iterator[columnar_merge.Chunk]:
    try:
        yield from chunks
    finally:
        shutil.rmtree(workdir, ignore_errors=True)
