"""The driver's view of a scatter: a compact, array-based index of every run, and the reduce plan.

Each map shard's summary lists its runs with their partition byte offsets as packed arrays
(base64 in the manifest). `RunIndex` holds them as one `(partitions + 1) x runs` int64 array,
so 10,000 map shards x 1,000 partitions cost 80 MB, and a reduce task's input is two views
into it (no copy in the driver) plus the run paths, shared by every task.

Skew: a partition whose bytes exceed `SKEW_FACTOR` x the median non-empty partition and
`ZEPHYR_SKEW_MIN_BYTES` (default 64 MiB) is cut into up to `ZEPHYR_SKEW_MAX_PIECES` (default
16) key ranges of about equal rows, at hash boundaries taken from the runs' batch index
(so a key is never split); each range is one reduce task, which reads only the batches of
each run that can hold its keys. Pieces are extra reduce shards: the stage then has more
shards (and outputs) than partitions, always the same for the same input; a stage whose ops see
its shards whole is never cut (`ShuffleReader.kept_whole`, set by `zephyr.plan.compile`).
"""

from __future__ import annotations

import base64
import math
import os
from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np

from zephyr.shuffle.keys import split_points

__all__ = ["BATCH_DTYPE", "PartitionInfo", "ReduceInput", "RunIndex", "pack", "unpack"]

BATCH_DTYPE = np.dtype([("part", "<i4"), ("first_h", "<u8"), ("rows", "<i8"), ("offset", "<i8")])
SKEW_FACTOR = 4.0
DEFAULT_SKEW_MIN_BYTES = 64 * 1024 * 1024
DEFAULT_SKEW_MAX_PIECES = 16
FORMATS = ("pickle", "arrow")


def pack(array: np.ndarray) -> str:
    return base64.b64encode(np.ascontiguousarray(array).tobytes()).decode("ascii")


def unpack(text: str, dtype) -> np.ndarray:
    return np.frombuffer(base64.b64decode(text), dtype=dtype)


@dataclass(frozen=True)
class ReduceInput:
    """One reduce task's input: a partition (or one key range of it) across runs."""

    partition: int
    piece: int
    pieces: int
    lo: int  # key range [lo, hi) of hashes; hi None: unbounded
    hi: int | None
    paths: tuple = field(repr=False)  # every run's path (shared by all tasks)
    shards: np.ndarray = field(repr=False)  # map shard of each run
    formats: np.ndarray = field(repr=False)  # index into FORMATS
    schema_lens: np.ndarray = field(repr=False)
    runs: np.ndarray = field(repr=False)  # indices of the runs with rows here
    heads: np.ndarray = field(repr=False)  # where each run's partition stream starts
    starts: np.ndarray = field(repr=False)  # where to start reading (a batch boundary)
    ends: np.ndarray = field(repr=False)

    def describe(self) -> str:
        return f"partition {self.partition}" + (f", key range {self.piece + 1}/{self.pieces}" if self.pieces > 1 else "")

    def ranges(self) -> list[tuple[str, int, str, int, int, int, int]]:
        """(path, map shard, format, head, start, end, schema length) per run with rows here."""
        return [
            (self.paths[r], int(self.shards[r]), FORMATS[self.formats[r]], int(h), int(s), int(e), int(self.schema_lens[r]))
            for r, h, s, e in zip(self.runs, self.heads, self.starts, self.ends)
            if e > s
        ]


@dataclass(frozen=True)
class PartitionInfo:
    partition: int
    bytes: int
    pieces: int


class ReduceTasks(list):
    """The reduce inputs, plus the largest partitions (for the progress bar and summary)."""

    largest: list[PartitionInfo] = []


class RunIndex:
    """Every run of a scatter as arrays: offsets[p, r] is where partition p starts in run r."""

    def __init__(self, summaries: Iterable[dict], num_partitions: int):
        summaries = list(summaries)
        runs = [run for summary in summaries for run in summary["runs"]]
        self.num_partitions = num_partitions
        self.paths = tuple(run["path"] for run in runs)
        self.shards = np.array([s["map_shard"] for s in summaries for _ in s["runs"]], dtype=np.int32)
        self.formats = np.array([FORMATS.index(run["format"]) for run in runs], dtype=np.uint8)
        self.schema_lens = np.array([run.get("schema_len", 0) for run in runs], dtype=np.int32)
        self.offsets = np.empty((num_partitions + 1, len(runs)), dtype=np.int64)
        batches = []
        for r, run in enumerate(runs):
            self.offsets[:, r] = unpack(run["offsets"], np.int64)
            if run.get("batches"):
                found = unpack(run["batches"], BATCH_DTYPE)
                batches.append((np.full(len(found), r, dtype=np.int32), found))
        self.batch_runs = np.concatenate([b[0] for b in batches]) if batches else np.empty(0, np.int32)
        self.batches = np.concatenate([b[1] for b in batches]) if batches else np.empty(0, BATCH_DTYPE)

    def partition_bytes(self) -> np.ndarray:
        """Bytes of each partition over all runs (the difference of offset row sums: no temporaries)."""
        return np.diff(self.offsets.sum(axis=1))

    def plan(self, split: bool = True) -> ReduceTasks:
        """One ReduceInput per partition, or several key ranges for a skewed one."""
        sizes = self.partition_bytes()
        pieces = _pieces(sizes) if split else np.ones(len(sizes), dtype=np.int64)
        tasks = ReduceTasks()
        for p in range(self.num_partitions):
            points = self._split_points(p, int(pieces[p])) if pieces[p] > 1 else []
            bounds = [0, *points, None]
            for i in range(len(bounds) - 1):
                tasks.append(self._input(p, i, len(bounds) - 1, bounds[i], bounds[i + 1]))
        counts: dict[int, int] = {}
        for t in tasks:
            counts[t.partition] = t.pieces
        order = np.argsort(-sizes, kind="stable")[:3]
        tasks.largest = [PartitionInfo(int(p), int(sizes[p]), counts.get(int(p), 1)) for p in order if sizes[p] > 0]
        return tasks

    def _split_points(self, p: int, pieces: int) -> list[int]:
        mine = self.batches["part"] == p
        return split_points(self.batches["first_h"][mine], self.batches["rows"][mine], pieces)

    def _input(self, p: int, piece: int, pieces: int, lo: int, hi: int | None) -> ReduceInput:
        heads, ends = self.offsets[p], self.offsets[p + 1]
        runs = np.arange(len(self.paths), dtype=np.int32)
        if not (ends > heads).all():
            runs = np.flatnonzero(ends > heads).astype(np.int32)
            heads, ends = heads[runs], ends[runs]
        starts = heads
        if pieces > 1:
            starts, ends = self._narrow(p, runs, heads, ends, lo, hi)
        return ReduceInput(p, piece, pieces, lo, hi, self.paths, self.shards, self.formats, self.schema_lens,
                           runs, heads, starts, ends)

    def _narrow(self, p, runs, heads, ends, lo, hi) -> tuple[np.ndarray, np.ndarray]:
        """Per run, the byte range of the batches that can hold hashes in [lo, hi)."""
        starts, ends = heads.copy(), ends.copy()
        mine = self.batches["part"] == p
        batch_runs, batches = self.batch_runs[mine], self.batches[mine]
        position = {int(r): i for i, r in enumerate(runs)}
        for r in np.unique(batch_runs):
            i = position[int(r)]
            rows = batches[batch_runs == r]  # in file order: first hashes ascending
            first = rows["first_h"]
            # batch j can hold [first[j], first[j+1]] (a key may straddle two batches)
            begin = max(0, int(np.searchsorted(first, np.uint64(lo), side="left")) - 1)
            stop = len(rows) if hi is None else int(np.searchsorted(first, np.uint64(hi), side="left"))
            starts[i] = rows["offset"][begin]
            if stop < len(rows):
                ends[i] = rows["offset"][stop]
        return starts, ends


def _pieces(sizes: np.ndarray) -> np.ndarray:
    """How many key ranges each partition is cut into (1: not split)."""
    pieces = np.ones(len(sizes), dtype=np.int64)
    max_pieces = int(os.environ.get("ZEPHYR_SKEW_MAX_PIECES", DEFAULT_SKEW_MAX_PIECES))
    min_bytes = int(os.environ.get("ZEPHYR_SKEW_MIN_BYTES", DEFAULT_SKEW_MIN_BYTES))
    nonempty = sizes[sizes > 0]
    if max_pieces <= 1 or len(nonempty) < 2:
        return pieces
    median = float(np.median(nonempty))
    for p in np.flatnonzero((sizes > SKEW_FACTOR * median) & (sizes > min_bytes)):
        pieces[p] = min(max_pieces, math.ceil(sizes[p] / median))
    return pieces
