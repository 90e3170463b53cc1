"""The reduce side's sorted chunks and the modes that read them; the batch-per-round k-way merge.

`slices.merge_slices` makes the chunks; `merge_sorted` below is its fallback for a hash group
larger than a run's share of the task's memory (it holds one batch per run whatever the groups).

Each source is a sorted stream of record batches (one partition, or one key range of it, from
one run). A round takes, from every source's current batch, the rows whose full sort key
`(h, kb, sort value, s, pos)` (`s, pos`: the origin, `zephyr.shuffle.origin`) is at most the *frontier*: the smallest last key of
any current batch. No later row of any source can sort before the frontier, so those rows
are final; they are concatenated and ordered with one NumPy `lexsort` (Arrow's multi-column
sort when hashes collide or a sort value is involved) and handed on as one sorted chunk.
Memory is one batch per source plus one chunk. Rows up to the frontier are all taken, equal
keys too, so the source whose batch ends at the frontier always empties it: every round
progresses (rows of equal full keys, items made from one item after a shuffle, keep their
sources' order: map shard, run, position).

The modes (keep the first row per key, reduce groups, concatenate) read chunks and convert
only the rows they hand on (`columnar.records_of`). Rows whose payload is JSON lines are handed
on by keep-first and concatenate as a `JsonLines`, which a JSONL writer copies as bytes.
"""

from __future__ import annotations

import bisect
import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephyr.shuffle.columnar import JSON_COLUMN, is_json, key_of, payload_columns, payload_names, records_of
from zephyr.io.json_records import JsonLines
from zephyr.dedup import report
from zephyr.shuffle.origin import SHIFT, Origin, published
from zephyr.shuffle.runs import rows_per_batch

_RECORD_SLICE = 4096

__all__ = ["Chunk", "concatenate", "first_per_key", "group_starts", "merge_sorted", "payload_records", "reduce_groups", "sort_order", "with_shard"]


def with_shard(batch: pa.RecordBatch, shard: int) -> pa.RecordBatch:
    """Add the map shard column `s` (a run's rows all come from one shard) if it is missing."""
    if "s" in batch.schema.names:
        return batch
    column = pa.array(np.full(batch.num_rows, shard, dtype=np.int32))
    return batch.add_column(batch.schema.get_field_index("pos"), "s", column)


def sort_order(table: pa.Table, leading: str | None = None) -> np.ndarray:
    """Row order by ([leading,] h, kb, sv, s, pos).

    Rows mostly arrive in (s, pos) order: a source stage's spill buffer in position order, a
    merge round's pieces concatenated in run order (runs are listed by map shard, then run
    number, and each piece is sorted). Then, without a sort value, a *stable* sort on
    ([leading,] h) is the full order, as long as equal hashes only ever mean equal key bytes
    and rows of equal hashes are in (s, pos) order (both checked, on those rows only). Rows
    whose origins (`zephyr.shuffle.origin`) arrive in another order are sorted by them with
    one more `lexsort`; Arrow's multi-column sort handles a collision, and any sort value.
    """
    names = table.schema.names
    h = _numpy(table, "h")
    if "sv" not in names:
        lead = (_numpy(table, leading),) if leading else ()
        order = np.lexsort((h, *lead)) if leading else np.argsort(h, kind="stable")
        same = _equal_neighbours(h, order)
        if not _has_collisions(table, order, same):
            if "s" not in names or _origin_ordered(table, order, same):
                return order
            return np.lexsort((_numpy(table, "pos"), _numpy(table, "s"), h, *lead))
    keys = [(c, "ascending") for c in ((leading,) if leading else ()) + ("h", "kb", "sv", "s", "pos") if c in names]
    return pc.sort_indices(table, sort_keys=keys).to_numpy()


def _numpy(table, name: str) -> np.ndarray:
    return _one_chunk(table.column(name)).to_numpy()


def _equal_neighbours(h: np.ndarray, order: np.ndarray) -> np.ndarray:
    """The sorted positions i whose row has the same hash as row i + 1."""
    hs = h[order]
    return np.flatnonzero(hs[1:] == hs[:-1])


def _has_collisions(table, order: np.ndarray, same: np.ndarray) -> bool:
    """Whether two different key bytes share a hash among these rows (then h alone cannot order)."""
    if not len(same):
        return False
    kb = table.column("kb")
    left = kb.take(pa.array(order[same]))
    right = kb.take(pa.array(order[same + 1]))
    return not pc.all(pc.equal(left, right)).as_py()


def _origin_ordered(table, order: np.ndarray, same: np.ndarray) -> bool:
    """Whether each row of equal hash as the next is not after it by (s, pos)."""
    if not len(same):
        return True
    s, pos = _numpy(table, "s"), _numpy(table, "pos")
    a, b = order[same], order[same + 1]
    return bool(np.all((s[a] < s[b]) | ((s[a] == s[b]) & (pos[a] <= pos[b]))))


class _Cursor:
    """One sorted source: its current batch and how far into it the merge has taken."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches = batches
        self.batch: pa.RecordBatch | None = None
        self.start = 0
        self.advance()

    def advance(self) -> None:
        self.batch, self.start, self.last = None, 0, None
        for batch in self._batches:
            if batch.num_rows:
                self.batch, self.h = batch, batch.column("h").to_numpy()
                self.last = self.key(batch.num_rows - 1)  # the frontier's candidate, once per batch
                return

    def key(self, row: int) -> tuple:
        return tuple(self.batch.column(c)[row].as_py() for c in _key_columns(self.batch))

    def take_until(self, frontier: tuple) -> pa.RecordBatch | None:
        """Rows from `start` whose full key is <= frontier (the batch is sorted); None when
        there are none (its next hash is past the frontier's)."""
        h = np.uint64(frontier[0])
        if self.h[self.start] > h:
            return None
        lo = self.start + int(np.searchsorted(self.h[self.start :], h, side="left"))
        hi = self.start + int(np.searchsorted(self.h[self.start :], h, side="right"))
        cut = bisect.bisect_right(range(lo, hi), frontier, key=self.key) + lo  # rows with equal hashes
        piece = self.batch.slice(self.start, cut - self.start)
        self.start = cut
        if self.start == self.batch.num_rows:
            self.advance()
        return piece


def _key_columns(batch) -> tuple[str, ...]:
    return tuple(c for c in ("h", "kb", "sv", "s", "pos") if c in batch.schema.names)


def merge_sorted(sources: list[Iterator[pa.RecordBatch]], schema: pa.Schema) -> Iterator[Chunk]:
    """Sorted chunks of the union of sorted sources that share `schema` (see the module doc)."""
    cursors = [c for c in (_Cursor(s) for s in sources) if c.batch is not None]
    while cursors:
        if len(cursors) == 1:  # one source left: its batches are already in order
            cursor = cursors[0]
            piece = cursor.batch.slice(cursor.start)
            yield Chunk(pa.Table.from_batches([piece], schema=schema), np.arange(piece.num_rows))
            cursor.advance()
            cursors = [c for c in cursors if c.batch is not None]
            continue
        frontier = min(c.last for c in cursors)
        pieces = [p for p in (c.take_until(frontier) for c in cursors) if p is not None and p.num_rows]
        if not pieces:  # the cursor whose batch ends at the frontier always empties it: never here
            raise AssertionError(f"merge round made no progress at frontier {frontier!r:.200}")
        cursors = [c for c in cursors if c.batch is not None]
        table = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
        yield Chunk(table, sort_order(table))


class Chunk:
    """Rows of a merge round (`table`, one chunk per column) and their sorted `order`."""

    def __init__(self, table: pa.Table, order: np.ndarray):
        self.table, self.order = table, order

    def starts(self, previous: tuple | None) -> np.ndarray:
        """Per sorted row: does it start a new key (vs the row before, or the last chunk's key)?"""
        return group_starts(_numpy(self.table, "h")[self.order], self.table.column("kb"), self.order, previous)

    def last_key(self) -> tuple:
        row = int(self.order[-1])
        return int(self.table.column("h")[row].as_py()), self.table.column("kb")[row].as_py()

    def sorted_slices(self, rows: np.ndarray | None = None, payload_only: bool = False, size: int = 0,
                      origins: bool = False) -> Iterator[pa.Table]:
        """The sorted rows (or the sorted positions `rows`) a slice at a time, so a big round
        never holds all its rows as Python objects at once. `payload_only`: just the payload
        columns (the key bytes, often most of a row's bytes, are not copied), and the origin
        columns `s`, `pos` with `origins`."""
        table = self.table
        if payload_only:
            table = table.select(payload_names(table.schema) + (["s", "pos"] if origins else []))
        order = self.order if rows is None else self.order[rows]
        contiguous = len(order) and order[0] == 0 and (np.diff(order) == 1).all()
        size = size or _RECORD_SLICE
        for start in range(0, len(order), size):
            if contiguous:
                yield table.slice(start, min(size, len(order) - start))
            else:
                yield table.take(pa.array(order[start : start + size]))

    def sorted_batches(self) -> Iterator[pa.Table]:
        """The sorted rows in tables of about `BATCH_BYTES` (a run's batch), each taken on its own."""
        yield from self.sorted_slices(size=rows_per_batch(self.table))

    def record_lists(self) -> Iterator[list]:
        """Python records of the sorted rows, a list per slice."""
        return map(payload_records, self.sorted_slices())

    def origins(self) -> list[int]:
        """The packed origin (`zephyr.shuffle.origin`) of each sorted row."""
        return _packed_origins(self.table)[self.order].tolist()


def _packed_origins(table: pa.Table) -> np.ndarray:
    return _numpy(table, "s").astype(np.int64) << SHIFT | _numpy(table, "pos")


def group_starts(h: np.ndarray, kb, order: np.ndarray, previous: tuple | None) -> np.ndarray:
    """For rows in sorted order (hashes `h`; key bytes `kb[order[i]]`): does row i start a key?"""
    if not len(h):
        return np.zeros(0, dtype=bool)
    starts = np.empty(len(h), dtype=bool)
    starts[1:] = h[1:] != h[:-1]
    same = np.flatnonzero(~starts[1:]) + 1
    if len(same):  # equal hashes: a new key only if the key bytes differ (a collision)
        differ = pc.not_equal(kb.take(pa.array(order[same])), kb.take(pa.array(order[same - 1])))
        starts[same[differ.to_numpy(zero_copy_only=False)]] = True
    starts[0] = previous is None or (int(h[0]), kb[int(order[0])].as_py()) != previous
    return starts


def payload_records(table: pa.Table) -> list:
    """The records of a shuffle table's payload (JSON lines `j`, or fields `c0, c1, ...`)."""
    columns, description = payload_columns(table)
    return records_of(list(map(_one_chunk, columns)), description)


def _handed_on(tables: Iterator[pa.Table], origin: Origin | None = None) -> Iterator[Any] | JsonLines:
    """The records of sorted slices: a `JsonLines` when the payload is JSON lines; one at a time,
    each origin published in `origin` as its record is handed on, with `origin`."""
    if origin is not None:
        return _originated(tables, origin)
    first = next(tables, None)
    if first is None:
        return iter(())
    tables = itertools.chain([first], tables)
    if is_json(first.schema):
        return JsonLines(_one_chunk(t.column(JSON_COLUMN)) for t in tables)
    return itertools.chain.from_iterable(map(payload_records, tables))


def _originated(tables: Iterator[pa.Table], origin: Origin) -> Iterator[Any]:
    for table in tables:
        for record, value in zip(payload_records(table), _packed_origins(table).tolist()):
            origin.value = value
            yield record


def _one_chunk(column):
    """An array for a column; `combine_chunks` copies even a single chunk, so that is taken as is."""
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def first_per_key(chunks: Iterator[Chunk], origin: Origin | None = None) -> Iterator[Any] | JsonLines:
    """Deduplicate: the first row of each key (rows arrive by origin within a key). Records are
    handed on through `chain` (no Python frame per record), or one at a time with their origins
    published in `origin`."""
    return _handed_on(_first_slices(chunks, origin is not None), origin)


def _first_slices(chunks: Iterator[Chunk], origins: bool) -> Iterator[pa.Table]:
    previous = None
    for chunk in chunks:
        starts = chunk.starts(previous)
        previous = chunk.last_key()
        report.count("documents_out", int(starts.sum()))  # the deduplicate's documents out (`zephyr.dedup.report`)
        yield from chunk.sorted_slices(None if starts.all() else np.flatnonzero(starts), payload_only=True, origins=origins)


def concatenate(chunks: Iterator[Chunk], origin: Origin | None = None) -> Iterator[Any] | JsonLines:
    tables = (table for chunk in chunks for table in chunk.sorted_slices(payload_only=True, origins=origin is not None))
    return _handed_on(tables, origin)


def reduce_groups(chunks: Iterator[Chunk], reducer: Callable[..., Any], origin: Origin | None = None) -> Iterator[Any]:
    """`reducer(key, items)` per key; a key's items stream across chunks, never held whole. With
    `origin`, each output is handed on with its group's first item's origin published there."""
    yields_many = inspect.isgeneratorfunction(reducer)

    def rows() -> Iterator[tuple[int, Any, Any, int]]:
        previous, group, first = None, 0, 0
        for chunk in chunks:
            starts = chunk.starts(previous)
            previous = chunk.last_key()
            kb = chunk.table.column("kb")
            origins = chunk.origins() if origin is not None else None
            records = itertools.chain.from_iterable(chunk.record_lists())
            for i, (start, item) in enumerate(zip(starts.tolist(), records)):
                if start:
                    group += 1
                    key = key_of(kb[int(chunk.order[i])].as_py())
                    first = origins[i] if origins is not None else 0
                yield group, key, item, first

    for _, members in itertools.groupby(rows(), key=lambda r: r[0]):
        first = next(members)
        items = itertools.chain([first[2]], (r[2] for r in members))
        result = reducer(first[1], items)
        outputs = result if yields_many else (result,)
        if origin is None:
            yield from outputs
        else:
            yield from published(outputs, origin, first[3])
