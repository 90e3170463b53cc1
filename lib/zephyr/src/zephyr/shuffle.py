"""Scatter and gather: the stage boundary behind group_by, deduplicate, reshard and reduce.

Map side (`ScatterSink`): each item gets a partition (a stable hash of its key, or round robin
for reshard) and a sort key (key bytes, optional sort_by value, input position). Items are
serialized as they arrive into a buffer sized from the task's memory budget; a full buffer is
sorted, combined (optional combiner) and spilled as one run file: zstd frames grouped by
partition plus an index of each partition's byte range. When the shard is done, a manifest
listing its runs is written atomically; its existence marks the map shard finished, so a rerun
skips it (resume after a dead driver).

Reduce side (`ShuffleReader`): partition p's task reads p's byte range from every run and
k-way merges them (`heapq.merge`), holding one frame per run, then streams groups to the
reducer (or keeps the first item per key, or concatenates for reshard). No side holds a whole
shard or a whole group. Everything lives under `<scratch>/<stage fingerprint>/` and is removed
after a successful run.
"""

from __future__ import annotations

import hashlib
import heapq
import inspect
import itertools
import pickle
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import orjson
import zstandard

from zephyr import counters
from zephyr.io.files import atomic_write, url_to_fs
from zephyr.ops import callable_name

__all__ = ["HashPartition", "RoundRobin", "ScatterSink", "ShuffleReader", "key_bytes", "partition_of"]

_FRAME_TARGET = 256 * 1024  # uncompressed bytes of records per frame
_RECORD_OVERHEAD = 120  # rough bytes of tuple/list bookkeeping per buffered record
DEFAULT_BUFFER = 256 * 1024 * 1024  # without a task memory budget
MIN_BUFFER = 1024 * 1024
_LEN = struct.Struct("<I")


def key_bytes(key: Any) -> bytes:
    """A canonical, process-independent encoding of a key (JSON with sorted keys, else pickle)."""
    try:
        return b"j" + orjson.dumps(key, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return b"p" + pickle.dumps(key, protocol=5)


def partition_of(kb: bytes, num_partitions: int) -> int:
    """Stable across processes and machines (blake2b, not Python's salted `hash`)."""
    return int.from_bytes(hashlib.blake2b(kb, digest_size=8).digest(), "little") % num_partitions


def _dumps(obj: Any) -> bytes:
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:  # classes defined in __main__ or dynamically: pickle them by value
        return cloudpickle.dumps(obj, protocol=5)


@dataclass(frozen=True)
class HashPartition:
    """Partition by a stable hash of `key(item)`; within a partition, sort by key then `sort_by`."""

    key: Callable[[Any], Any]
    sort_by: Callable[[Any], Any] | None = None
    combiner: Callable[..., Any] | None = None

    def describe(self) -> str:
        return f"hash({callable_name(self.key)})"


@dataclass(frozen=True)
class RoundRobin:
    """Spread items evenly, keeping input order within each output shard."""

    def describe(self) -> str:
        return "round-robin"


@dataclass(frozen=True)
class ScatterSink:
    num_partitions: int
    partitioner: HashPartition | RoundRobin
    root: str = ""  # bound by the runner: <scratch>/<stage fingerprint>

    def describe(self) -> str:
        return f"scatter({self.partitioner.describe()} into {self.num_partitions} shards)"

    def manifest_path(self, shard: int) -> str:
        return f"{self.root}/map-{shard:05d}.json"

    def write(self, stream: Iterator[Any], task) -> dict:
        budget = max(MIN_BUFFER, task.memory // 4) if task.memory else DEFAULT_BUFFER
        buffer: list[tuple] = []
        used = 0
        runs: list[dict] = []
        records = 0
        part = self.partitioner
        for pos, item in enumerate(stream):
            if isinstance(part, HashPartition):
                key = part.key(item)
                kb = key_bytes(key)
                p = partition_of(kb, self.num_partitions)
                sortval = part.sort_by(item) if part.sort_by is not None else None
            else:
                key, kb, sortval = None, b"", None
                p = (task.shard + pos) % self.num_partitions
            payload = _dumps((key, item))
            buffer.append((p, kb, sortval, pos, payload))
            used += len(payload) + len(kb) + _RECORD_OVERHEAD
            records += 1
            if used >= budget:
                runs.append(self._spill(buffer, task.shard, len(runs)))
                buffer, used = [], 0
        if buffer:
            runs.append(self._spill(buffer, task.shard, len(runs)))
        counters.increment("zephyr/shuffle_records", records)
        counters.increment("zephyr/shuffle_runs", len(runs))
        summary = {"map_shard": task.shard, "records": records, "runs": runs}
        with atomic_write(self.manifest_path(task.shard)) as f:
            f.write(orjson.dumps(summary))
        return summary

    def _spill(self, buffer: list[tuple], shard: int, run: int) -> dict:
        by_value = isinstance(self.partitioner, HashPartition) and self.partitioner.sort_by is not None
        buffer.sort(key=(lambda r: (r[0], r[1], r[2], r[3])) if by_value else (lambda r: (r[0], r[1], r[3])))
        if isinstance(self.partitioner, HashPartition) and self.partitioner.combiner is not None:
            buffer = list(self._combine(buffer))
        path = f"{self.root}/map-{shard:05d}-run-{run:03d}.bin"
        index: dict[str, list[int]] = {}
        compressor = zstandard.ZstdCompressor(level=1)
        offset = 0
        with atomic_write(path) as f:
            for p, group in itertools.groupby(buffer, key=lambda r: r[0]):
                start = offset
                frame: list[tuple] = []
                size = 0
                for _, kb, sortval, pos, payload in group:
                    frame.append((kb, sortval, shard, pos, payload))
                    size += len(payload) + len(kb)
                    if size >= _FRAME_TARGET:
                        offset += _write_frame(f, compressor, frame)
                        frame, size = [], 0
                if frame:
                    offset += _write_frame(f, compressor, frame)
                index[str(p)] = [start, offset - start]
        return {"path": path, "index": index}

    def _combine(self, buffer: list[tuple]) -> Iterator[tuple]:
        part = self.partitioner
        for (p, kb), group in itertools.groupby(buffer, key=lambda r: (r[0], r[1])):
            first = next(group)
            key, item0 = pickle.loads(first[4])
            items = itertools.chain([item0], (pickle.loads(r[4])[1] for r in group))
            combined = part.combiner(key, items)
            sortval = part.sort_by(combined) if part.sort_by is not None else None
            yield (p, kb, sortval, first[3], _dumps((key, combined)))


def _write_frame(f, compressor, frame: list[tuple]) -> int:
    data = compressor.compress(pickle.dumps(frame, protocol=5))
    f.write(_LEN.pack(len(data)))
    f.write(data)
    return _LEN.size + len(data)


def _read_range(path: str, offset: int, length: int) -> Iterator[tuple]:
    """Records of one partition of one run, a frame at a time (the file is reopened per frame
    so that thousands of runs never hold thousands of open files)."""
    fs, fs_path = url_to_fs(path)
    decompressor = zstandard.ZstdDecompressor()
    end = offset + length
    while offset < end:
        with fs.open(fs_path, "rb") as f:
            f.seek(offset)
            (size,) = _LEN.unpack(f.read(_LEN.size))
            data = f.read(size)
        offset += _LEN.size + size
        yield from pickle.loads(decompressor.decompress(data))


class GroupMode:
    """How the reduce side turns merged records into items."""


@dataclass(frozen=True)
class ReduceGroups(GroupMode):
    reducer: Callable[..., Any]

    def apply(self, merged: Iterator[tuple]) -> Iterator[Any]:
        yields_many = inspect.isgeneratorfunction(self.reducer)
        for _, group in itertools.groupby(merged, key=lambda r: r[0]):
            first = next(group)
            key, item0 = _loads(first[4])
            items = itertools.chain([item0], (_loads(r[4])[1] for r in group))
            result = self.reducer(key, items)
            if yields_many:
                yield from result
            else:
                yield result


@dataclass(frozen=True)
class FirstPerKey(GroupMode):
    def apply(self, merged: Iterator[tuple]) -> Iterator[Any]:
        for _, group in itertools.groupby(merged, key=lambda r: r[0]):
            yield _loads(next(group)[4])[1]


@dataclass(frozen=True)
class Concatenate(GroupMode):
    def apply(self, merged: Iterator[tuple]) -> Iterator[Any]:
        for record in merged:
            yield _loads(record[4])[1]


def _loads(payload: bytes) -> Any:
    return pickle.loads(payload)


@dataclass(frozen=True)
class ShuffleReader:
    """The input of the stage after a scatter: partition p's ranges from every map shard's runs."""

    num_partitions: int
    mode: GroupMode
    label: str
    sorted_by_value: bool = False

    def describe(self) -> str:
        return self.label

    def tasks(self, stage, previous) -> list:
        from zephyr.shard import ShardTask

        ranges: list[list[tuple]] = [[] for _ in range(self.num_partitions)]
        for result in previous or ():  # None: upstream skipped because every output exists
            for run in result.summary["runs"]:
                for p, (offset, length) in run["index"].items():
                    ranges[int(p)].append((run["path"], offset, length))
        return [
            ShardTask(stage.index, p, self.num_partitions, f"{self.label} shard {p}", tuple(ranges[p]))
            for p in range(self.num_partitions)
        ]

    def read(self, task) -> Iterator[Any]:
        streams = [_read_range(path, offset, length) for path, offset, length in task.items]
        if self.sorted_by_value:
            merged = heapq.merge(*streams, key=lambda r: (r[0], r[1], r[2], r[3]))
        else:
            merged = heapq.merge(*streams, key=lambda r: (r[0], r[2], r[3]))
        return self.mode.apply(merged)
