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
reducer (or keeps the first item per key, or concatenates for reshard). When there are more
runs than half the task's memory allows open at once, groups of them are first merged into
intermediate runs in a task-local temporary directory (`zephyr-merge-<pid>@<host>-*`, swept
by a later run if the task is killed), as many passes as needed. No side
holds a whole shard or a whole group. Everything lives under `<scratch>/<stage fingerprint>/` and is removed
after a successful run.
"""

from __future__ import annotations

import hashlib
import heapq
import inspect
import itertools
import os
import pickle
import shutil
import struct
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle
import orjson
import zstandard

from zephyr import counters
from zephyr.io.files import atomic_write, url_to_fs
from zephyr.io.temporaries import make_temp_dir
from zephyr.ops import callable_name

__all__ = ["HashPartition", "RoundRobin", "ScatterSink", "ShuffleReader", "keep_first", "key_bytes", "partition_of"]

_FRAME_TARGET = 256 * 1024  # uncompressed bytes of records per frame
_RECORD_OVERHEAD = 300  # bytes of tuple/list/bytes bookkeeping per buffered record (measured ~700 B/record in all)
DEFAULT_BUFFER = 256 * 1024 * 1024  # without a task memory budget
MIN_BUFFER = 1024 * 1024
_MEMORY_PER_OPEN_RUN = 1024 * 1024  # one decoded frame per run being merged (measured ~0.55 MiB)
MIN_FAN_IN = 4
_LEN = struct.Struct("<I")
_READ_CHUNK = 256 * 1024


def key_bytes(key: Any) -> bytes:
    """A canonical, process-independent encoding of a key: JSON with sorted keys (sets become
    sorted lists), else pickle with sets replaced by their sorted elements."""
    canonical = _canonical(key)
    try:
        return b"j" + orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return b"p" + pickle.dumps(canonical, protocol=5)


class _SortedSet(tuple):
    """A set's elements in a canonical order (their own encodings, sorted)."""


def _canonical(value: Any) -> Any:
    """Sets pickle in hash order, which PYTHONHASHSEED changes per process: sort them."""
    if isinstance(value, (set, frozenset)):
        return _SortedSet(sorted((_canonical(v) for v in value), key=key_bytes))
    if isinstance(value, (list, tuple)) and not isinstance(value, _SortedSet):
        items = [_canonical(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def partition_of(kb: bytes, num_partitions: int) -> int:
    """Stable across processes and machines (blake2b, not Python's salted `hash`)."""
    return int.from_bytes(hashlib.blake2b(kb, digest_size=8).digest(), "little") % num_partitions


def keep_first(key: Any, items: Iterator[Any]) -> Any:
    """The combiner behind `deduplicate`: the first item of a group (they arrive in position order)."""
    return next(items)


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
        attempt = os.urandom(4).hex()  # a zombie attempt never overwrites runs another manifest names
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
                runs.append(self._spill(buffer, task.shard, f"{attempt}-{len(runs):03d}"))
                buffer, used = [], 0
        if buffer:
            runs.append(self._spill(buffer, task.shard, f"{attempt}-{len(runs):03d}"))
        counters.increment("zephyr/shuffle_records", records)
        counters.increment("zephyr/shuffle_runs", len(runs))
        # the shard's counters travel with its manifest, so a resumed run still counts it once
        summary = {"map_shard": task.shard, "records": records, "runs": runs, "counters": counters.current()}
        with atomic_write(self.manifest_path(task.shard), remove_stale=False) as f:
            f.write(orjson.dumps(summary))
        return summary

    def _spill(self, buffer: list[tuple], shard: int, run: str) -> dict:
        by_value = isinstance(self.partitioner, HashPartition) and self.partitioner.sort_by is not None
        buffer.sort(key=(lambda r: (r[0], r[1], r[2], r[3])) if by_value else (lambda r: (r[0], r[1], r[3])))
        if isinstance(self.partitioner, HashPartition) and self.partitioner.combiner is not None:
            buffer = list(self._combine(buffer))
            counters.increment("zephyr/combined_records", len(buffer))  # what crosses the shuffle
        path = f"{self.root}/map-{shard:05d}-run-{run}.bin"
        index: dict[str, list[int]] = {}
        compressor = zstandard.ZstdCompressor(level=1)
        offset = 0
        with atomic_write(path, remove_stale=False) as f:
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
    """Records of one partition of one run, a frame at a time, through ranged reads of
    `_READ_CHUNK` bytes (`cat_file` with start/end: one request each on object stores, and no
    file kept open, so thousands of runs never hold thousands of descriptors)."""
    fs, fs_path = url_to_fs(path)
    decompressor = zstandard.ZstdDecompressor()
    end = offset + length
    buffer = b""
    pos = offset  # file offset just past what `buffer` holds

    def need(n: int) -> bool:
        nonlocal buffer, pos
        while len(buffer) < n and pos < end:
            chunk = fs.cat_file(fs_path, start=pos, end=min(end, pos + max(_READ_CHUNK, n - len(buffer))))
            if not chunk:
                break
            buffer += chunk
            pos += len(chunk)
        return len(buffer) >= n

    while need(_LEN.size):
        (size,) = _LEN.unpack(buffer[: _LEN.size])
        if not need(_LEN.size + size):
            raise EOFError(f"{path}: shuffle run ends inside a frame at byte {pos - len(buffer)}")
        data = buffer[_LEN.size : _LEN.size + size]
        buffer = buffer[_LEN.size + size :]
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
            key, item0 = pickle.loads(first[4])
            items = itertools.chain([item0], (pickle.loads(r[4])[1] for r in group))
            result = self.reducer(key, items)
            if yields_many:
                yield from result
            else:
                yield result


@dataclass(frozen=True)
class FirstPerKey(GroupMode):
    def apply(self, merged: Iterator[tuple]) -> Iterator[Any]:
        for _, group in itertools.groupby(merged, key=lambda r: r[0]):
            yield pickle.loads(next(group)[4])[1]


@dataclass(frozen=True)
class Concatenate(GroupMode):
    def apply(self, merged: Iterator[tuple]) -> Iterator[Any]:
        for record in merged:
            yield pickle.loads(record[4])[1]


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
        ranges = list(task.items)
        fan_in = merge_fan_in(task.memory)
        if len(ranges) <= fan_in:
            return self.mode.apply(self._merge(ranges))
        return self._read_in_passes(ranges, fan_in)

    def _merge(self, ranges: list[tuple]) -> Iterator[tuple]:
        streams = [_read_range(path, offset, length) for path, offset, length in ranges]
        if self.sorted_by_value:
            return heapq.merge(*streams, key=lambda r: (r[0], r[1], r[2], r[3]))
        return heapq.merge(*streams, key=lambda r: (r[0], r[2], r[3]))

    def _read_in_passes(self, ranges: list[tuple], fan_in: int) -> Iterator[Any]:
        """Merge `fan_in` runs at a time into local intermediate runs until few enough remain."""
        workdir = make_temp_dir("merge")  # named for this process: a later run sweeps it if we are killed
        try:
            passes = 0
            while len(ranges) > fan_in:
                merged = []
                for i in range(0, len(ranges), fan_in):
                    path = os.path.join(workdir, f"pass-{passes}-{i:06d}.bin")
                    merged.append((path, 0, _write_run(path, self._merge(ranges[i : i + fan_in]))))
                for path, _, _ in ranges:
                    if path.startswith(workdir):
                        os.remove(path)
                ranges = merged
                passes += 1
            counters.increment("zephyr/merge_passes", passes)
            yield from self.mode.apply(self._merge(ranges))
        finally:
            shutil.rmtree(workdir, ignore_errors=True)


def merge_fan_in(memory: int | None) -> int:
    """How many runs a reduce task merges at once: half its memory, one frame per run."""
    budget = memory // 2 if memory else DEFAULT_BUFFER
    return max(MIN_FAN_IN, budget // _MEMORY_PER_OPEN_RUN)


def _write_run(path: str, records: Iterator[tuple]) -> int:
    """Write already-sorted records as one run of frames; returns its length in bytes."""
    compressor = zstandard.ZstdCompressor(level=1)
    length = 0
    frame: list[tuple] = []
    size = 0
    with open(path, "wb") as f:
        for record in records:
            frame.append(record)
            size += len(record[4]) + len(record[0])
            if size >= _FRAME_TARGET:
                length += _write_frame(f, compressor, frame)
                frame, size = [], 0
        if frame:
            length += _write_frame(f, compressor, frame)
    return length
