"""The map side of a shuffle: partition, buffer, sort and spill runs; write the manifest.

Items arrive one at a time and are gathered into chunks of about a MiB, sized from the bytes
per record the previous chunk measured (the first chunk is FIRST_CHUNK_ROWS records; a chunk
may be a single record, so big records never pile up past the buffer's budget). Each chunk's keys
(and `sort_by` values) are computed, encoded and hashed as a batch (`shuffle_keys`), and the
chunk becomes an Arrow record batch when its records convert exactly (`columnar`: their JSON
lines, or a column per field), else a list of pickled records. A buffer of a quarter of the
task's `memory` (256 MiB without a budget; an eighth for Arrow data, which the sort holds
twice) holds chunks; when full it is sorted by (partition, hash, key bytes, sort value,
origin) with NumPy/Arrow (the origin is the item's position in a source stage, else the one
its stage's reader published: `zephyr.shuffle.origin`), combined (deduplicate's keep-first is vectorized), and spilled as
one run (`runs.py`). A buffer is columnar while every chunk converts with one schema (a buffer
holding fields takes later chunks as fields); the first chunk that does not turns it (and
what it holds) into pickles, so mixed data always shuffles exactly.
When the shard is done its manifest (`map-NNNNN.json`, the run list with packed offsets) is
written atomically: its existence marks the map shard finished for a resumed run.
"""

from __future__ import annotations

import itertools
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import orjson
import pyarrow as pa

from zephyr import counters
from zephyr.dedup import report
from zephyr.switches import switched_on
from zephyr.engine.frame import Frame, Pieces
from zephyr.shuffle.frame_keys import frame_keys
from zephyr.engine.lines import json_lines
from zephyr.shuffle.columnar import FIELDS_META, json_enabled, JSON_COLUMN, JSON_DESCRIPTION, batch_rows, conform, dumps, is_json, key_column, payload_of, sort_value_column, unify_schemas
from zephyr.io.files import atomic_write
from zephyr.shuffle.merge import group_starts, sort_order
from zephyr.naming import callable_name
from zephyr.shuffle.run_index import BATCH_DTYPE, pack
from zephyr.shuffle.runs import ArrowRunWriter, write_pickle_frames
from zephyr.shuffle.keys import hash_key_bytes, key_bytes
from zephyr.shuffle.origin import Origin, split
import pickle

__all__ = ["HashPartition", "RoundRobin", "ScatterSink", "keep_first", "unorderable_sort_by"]

DEFAULT_BUFFER = 256 * 1024 * 1024  # without a task memory budget
MIN_BUFFER = 1024 * 1024
CHUNK_BYTES = 1024 * 1024
FIRST_CHUNK_ROWS = 16  # a task's first chunk: small, since nothing says yet how big its records are
MIN_CHUNK_ROWS = 1  # a chunk of big records may be one record: chunks never hold much more than CHUNK_BYTES
_RECORD_OVERHEAD = 300  # bytes of tuple/list/bytes bookkeeping per pickled record (measured ~700 B/record in all)


def _columnar_enabled() -> bool:
    """`ZEPHYR_SHUFFLE_COLUMNAR=0` forces the pickled path (to compare the two, or to debug)."""
    return switched_on("ZEPHYR_SHUFFLE_COLUMNAR")


def keep_first(key: Any, items: Iterator[Any]) -> Any:
    """The combiner behind `deduplicate`: the first item of a group (they arrive in origin order)."""
    return next(items)


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
    # set by the planner when the stage only loads JSON lines: its items are what orjson.loads
    # made, so they are JSON exactly (unless a key function changes them: key functions must not)
    parsed_json: bool = False

    def describe(self) -> str:
        return f"scatter({self.partitioner.describe()} into {self.num_partitions} shards)"

    def manifest_path(self, shard: int) -> str:
        return f"{self.root}/map-{shard:05d}.json"

    def write(self, stream: Iterator[Any], task, origin: Origin | None = None) -> dict:
        """Scatter the stage's `stream`; with `origin` (a stage that reads a shuffle), each item's
        origin is the one published when it arrives (`zephyr.shuffle.origin`), else its position."""
        budget = max(MIN_BUFFER, task.memory // 4) if task.memory else DEFAULT_BUFFER
        # sorting an Arrow buffer holds it twice (the buffer, then its sorted copy): budget half
        arrow_budget = budget // 2
        attempt = os.urandom(4).hex()  # a zombie attempt never overwrites runs another manifest names
        buffer = _Buffer(self, task.shard, task.num_shards)
        runs: list[dict] = []
        records = 0
        rows = FIRST_CHUNK_ROWS  # until the first chunk has measured what a record takes
        # the engine's pieces (frames or lists of records) are chunks as they come
        if origin is not None:  # (chunk, its items' origins) pairs
            chunks = _with_origins(stream, origin, lambda: rows)
        else:
            chunks = stream.chunks() if isinstance(stream, Pieces) else iter(lambda: list(itertools.islice(stream, rows)), [])
        for chunk in chunks:
            chunk, origins = chunk if origin is not None else (chunk, None)
            buffer.add(chunk, records, origins)
            records += len(chunk)
            rows = buffer.chunk_rows()
            if buffer.used >= (budget if buffer.pickled is not None else arrow_budget):
                runs.append(buffer.spill(f"{self.root}/map-{task.shard:05d}-run-{attempt}-{len(runs):03d}"))
                buffer = _Buffer(self, task.shard, task.num_shards)
        if buffer.rows:
            runs.append(buffer.spill(f"{self.root}/map-{task.shard:05d}-run-{attempt}-{len(runs):03d}"))
        counters.increment("zephyr/shuffle_records", records)
        if getattr(self.partitioner, "combiner", None) is keep_first:  # a deduplicate's documents in (`zephyr.dedup.report`)
            report.count("documents_in", records)
        counters.increment("zephyr/shuffle_runs", len(runs))
        counters.increment("zephyr/shuffle_runs_columnar", sum(r["format"] == "arrow" for r in runs))
        # the shard's counters travel with its manifest, so a resumed run still counts it once
        summary = {"map_shard": task.shard, "records": records, "runs": runs, "counters": counters.current()}
        with atomic_write(self.manifest_path(task.shard), remove_stale=False) as f:
            f.write(orjson.dumps(summary))
        return summary


def _with_origins(stream, origin: Origin, rows) -> Iterator[tuple[Any, list]]:
    """(chunk of `rows()` items, their packed origins): each item's origin as published when it
    arrived (a batch path's piece, all of whose rows come from the item last read, gets that one)."""
    if isinstance(stream, Pieces):
        for chunk in stream.chunks():
            yield chunk, [origin.value] * len(chunk)
        return
    while True:
        items: list = []
        origins: list = []
        for item in itertools.islice(stream, rows()):
            items.append(item)
            origins.append(origin.value)
        if not items:
            return
        yield items, origins


class _Buffer:
    """One run's worth of records: Arrow batches while every chunk converts, else pickles."""

    def __init__(self, sink: ScatterSink, shard: int, num_shards: int):
        self.sink = sink
        self.shard = shard
        # round-robin: where this input shard's items start, spread evenly over the outputs, so
        # that many small input shards fill many outputs (starting at `shard` piled them onto the
        # first ones: 10 input shards of 3 items filled 12 of 50 outputs)
        self.start = shard * sink.num_partitions // max(num_shards, 1)
        self.part = sink.partitioner
        self.hashed = isinstance(self.part, HashPartition)
        self.batches: list[pa.RecordBatch] = []
        self.schema: pa.Schema | None = None
        # (p, h, kb, sort value, origin shard, origin pos, payload) once the buffer holds pickles
        self.pickled: list[tuple] | None = None if _columnar_enabled() else []
        self.used = 0
        self.rows = 0
        self._bytes_per_row = 512.0

    def chunk_rows(self) -> int:
        return int(min(16384, max(MIN_CHUNK_ROWS, CHUNK_BYTES / max(self._bytes_per_row, 1.0))))

    def add(self, items: list | Frame, first_pos: int, origins: list | None = None) -> None:
        """Add a chunk whose first item is the stream's `first_pos`-th; `origins`: the items'
        packed origins (None: their positions in this shard are)."""
        if isinstance(items, Frame):
            batch = None if self.pickled is not None else self._rows_batch(items, first_pos, origins)
            if batch is None:
                return self.add(items.records(), first_pos, origins)
            self.batches.append(batch)
            self.used += batch.nbytes
            self.rows += len(items)
            self._bytes_per_row = batch.nbytes / len(items)
            return None
        keys = list(map(self.part.key, items)) if self.hashed else None
        sort_by = self.part.sort_by if self.hashed else None
        values = list(map(sort_by, items)) if sort_by is not None else None
        before = self.used
        batch = None if self.pickled is not None else self._columnar(items, keys, values, first_pos, origins)
        if batch is None:
            self._to_pickles()
            self._add_pickled(items, keys, values, first_pos, origins)
        else:
            self.batches.append(batch)
            self.used += batch.nbytes
        self.rows += len(items)
        self._bytes_per_row = (self.used - before) / len(items)

    def _columnar(self, items, keys, values, first_pos: int, origins) -> pa.RecordBatch | None:
        fields_only = self.schema is not None and not is_json(self.schema)  # keep one form per buffer
        payload = payload_of(items, parsed_json=self.sink.parsed_json, fields_only=fields_only)
        if payload is None:
            return None
        key = key_column(keys) if self.hashed else None
        if self.hashed and key is None:
            return None
        return self._assembled(key, len(items), values, first_pos, payload, origins)

    def _rows_batch(self, rows: Frame, first_pos: int, origins) -> pa.RecordBatch | None:
        """A frame's rows as they are: their JSON lines, keys from their key column (None
        where records are needed: a `sort_by` function, or a buffer that holds fields)."""
        if (self.hashed and self.part.sort_by is not None) or (self.schema is not None and not is_json(self.schema)) or not json_enabled():
            return None
        key = frame_keys(rows, self.part.key) if self.hashed else None
        if self.hashed and key is None:
            return None
        lines = json_lines(rows)
        if lines is None or (self.hashed and key is None):
            return None
        return self._assembled(key, len(rows), None, first_pos, ([lines], [JSON_COLUMN], JSON_DESCRIPTION), origins)

    def _assembled(self, key, n: int, values, first_pos: int, payload, origins) -> pa.RecordBatch | None:
        if key is not None:
            kb, h = key
            p = (h % np.uint64(self.sink.num_partitions)).astype(np.uint32)
        else:
            kb = pa.array([b""] * n, pa.large_binary())
            h = np.zeros(n, dtype=np.uint64)
            p = ((self.start + np.arange(first_pos, first_pos + n)) % self.sink.num_partitions).astype(np.uint32)
        columns, names = [pa.array(p), pa.array(h), kb], ["p", "h", "kb"]
        if values is not None:
            sv = sort_value_column(values)
            if sv is None:
                return None
            columns.append(sv)
            names.append("sv")
        if origins is None:
            columns.append(pa.array(np.arange(first_pos, first_pos + n, dtype=np.int64)))
            names.append("pos")
        else:  # the origin's shard differs from row to row: a column of its own (else added when read)
            shards, positions = split(origins)
            columns += [pa.array(shards), pa.array(positions)]
            names += ["s", "pos"]
        data, data_names, description = payload
        columns += data
        names += data_names
        batch = pa.RecordBatch.from_arrays(columns, names=names, metadata={FIELDS_META: orjson.dumps(description)})
        schema = batch.schema if self.schema is None else unify_schemas(self.schema, batch.schema)
        if schema is None:
            return None
        self.schema = schema
        return batch

    def _add_pickled(self, items, keys, values, first_pos: int, origins) -> None:
        n = len(items)
        positions = range(first_pos, first_pos + n)
        if self.hashed:
            kbs = [key_bytes(k) for k in keys]
            h = hash_key_bytes(kbs)
            p = (h % np.uint64(self.sink.num_partitions)).tolist()
            payloads = [dumps(pair) for pair in zip(keys, items)]
        else:
            kbs, h = [b""] * n, np.zeros(n, dtype=np.uint64)
            p = [(self.start + pos) % self.sink.num_partitions for pos in positions]
            payloads = [dumps((None, item)) for item in items]
        if origins is None:
            shards, at = itertools.repeat(self.shard), positions
        else:
            shards, at = (column.tolist() for column in split(origins))
        self.pickled.extend(zip(p, h.tolist(), kbs, values or itertools.repeat(None), shards, at, payloads))
        self.used += sum(map(len, payloads)) + sum(map(len, kbs)) + n * _RECORD_OVERHEAD

    def _to_pickles(self) -> None:
        """From now on this buffer holds pickles; convert the Arrow batches it already has."""
        if self.pickled is not None:
            return
        self.pickled = []
        for batch in self.batches:
            rows = batch_rows(conform(batch, self.schema), keyed=self.hashed)
            partitions = batch.column("p").to_pylist()
            self.pickled.extend((p, h, kb, sv, self.shard if s is None else s, pos, dumps((key, item)))
                                for p, (h, kb, sv, s, pos, key, item) in zip(partitions, rows))
        self.batches, self.schema = [], None

    def spill(self, stem: str) -> dict:
        combiner = self.part.combiner if self.hashed else None
        if self.pickled is None and combiner not in (None, keep_first):
            self._to_pickles()  # a general combiner runs on Python items
        if self.pickled is None:
            return self._spill_arrow(stem, combiner)
        return self._spill_pickled(stem, combiner)

    def _spill_arrow(self, stem: str, combiner) -> dict:
        table = pa.Table.from_batches([conform(b, self.schema) for b in self.batches], schema=self.schema)
        table = table.combine_chunks()  # Arrow's take is several times faster on one chunk
        self.batches = []
        order = sort_order(table, leading="p")
        if combiner is keep_first:  # keep the first row per key without moving the others
            order = order[group_starts(table.column("h").to_numpy()[order], table.column("kb"), order, None)]
            counters.increment("zephyr/combined_records", len(order))  # what crosses the shuffle
        table = table.take(pa.array(order))
        p = table.column("p").to_numpy()
        bounds = np.searchsorted(p, np.arange(self.sink.num_partitions + 1, dtype=np.uint32), side="left")
        table = table.drop_columns(["p"])
        path = stem + ".arrow"
        with atomic_write(path, remove_stale=False) as f:
            writer = ArrowRunWriter(f, path, table.schema, self.sink.num_partitions)
            writer.write(table, bounds)
        del table
        pa.default_memory_pool().release_unused()  # hand the sort's copies back before the next buffer fills
        batches = np.array(writer.batches, dtype=BATCH_DTYPE)
        counters.increment("zephyr/shuffle_bytes_written", int(writer.offsets[-1]))
        return {"path": path, "format": "arrow", "schema_len": writer.schema_len,
                "offsets": pack(writer.offsets), "batches": pack(batches) if len(batches) else ""}

    def _spill_pickled(self, stem: str, combiner) -> dict:
        records = self.pickled
        by_value = self.hashed and self.part.sort_by is not None
        try:
            records.sort(key=(lambda r: r[:6]) if by_value else (lambda r: (r[0], r[1], r[2], r[4], r[5])))
        except TypeError as e:  # only sort_by values can fail to compare: the rest are ints and bytes
            raise unorderable_sort_by(e) from e
        if combiner is not None:
            records = list(self._combine(records, combiner))
            counters.increment("zephyr/combined_records", len(records))
        offsets = np.zeros(self.sink.num_partitions + 1, dtype=np.int64)
        path = stem + ".bin"
        length = 0
        index: list[tuple] = []  # (partition, first hash, records, offset) of partitions of several frames
        with atomic_write(path, remove_stale=False) as f:
            for p, group in itertools.groupby(records, key=lambda r: r[0]):
                offsets[p] = length
                frames: list[tuple] = []
                length += write_pickle_frames(f, (r[1:] for r in group), frames)
                if len(frames) > 1:
                    index += [(p, h, n, offsets[p] + at) for h, n, at in frames]
                offsets[p + 1 :] = length
        batches = np.array(index, dtype=BATCH_DTYPE)
        counters.increment("zephyr/shuffle_bytes_written", length)
        return {"path": path, "format": "pickle", "offsets": pack(offsets), "batches": pack(batches) if index else ""}

    def _combine(self, records: list[tuple], combiner) -> Iterator[tuple]:
        sort_by = self.part.sort_by
        for _, group in itertools.groupby(records, key=lambda r: (r[0], r[1], r[2])):
            first = next(group)
            key, item0 = pickle.loads(first[6])
            items = itertools.chain([item0], (pickle.loads(r[6])[1] for r in group))
            combined = combiner(key, items)
            # a generator combiner (the reference project's form) yields the group's partial items
            outputs = list(combined) if isinstance(combined, Iterator) else [combined]
            if sort_by is not None and len(outputs) > 1:
                try:
                    outputs.sort(key=sort_by)
                except TypeError as e:
                    raise unorderable_sort_by(e) from e
            for item in outputs:
                sv = sort_by(item) if sort_by is not None else None
                yield (first[0], first[1], first[2], sv, first[4], first[5], dumps((key, item)))


def unorderable_sort_by(error: TypeError) -> TypeError:
    """The TypeError of comparing two `sort_by` values, saying so (Python's own names no op)."""
    return TypeError(f"group_by(sort_by=...) returned values that cannot be ordered against each other ({error}); "
                     "sort_by must give values of one comparable type within a group (e.g. all ints, or tuples "
                     "without None)")
