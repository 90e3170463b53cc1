"""The reduce side's k-way merge of columnar runs, a batch at a time.

Each source is a sorted stream of record batches (one partition, or one key range of it, from
one run). A round takes, from every source's current batch, the rows whose full sort key
`(h, kb, sort value, map shard, position)` is at most the *frontier*: the smallest last key of
any current batch. No later row of any source can sort before the frontier, so those rows
are final; they are concatenated and ordered with one NumPy `lexsort` (Arrow's multi-column
sort when hashes collide or a sort value is involved) and handed on as one sorted chunk.
Memory is one batch per source plus one chunk. Full sort keys are unique (shard, position),
so the source whose batch ends at the frontier always empties it: every round progresses.

The modes (keep the first row per key, reduce groups, concatenate) read chunks and convert
only the rows they hand to Python (`columnar.records_of`).
"""

from __future__ import annotations

import inspect
import itertools
from collections.abc import Callable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from zephyr.columnar import FIELDS_META, key_of, records_of

__all__ = ["concatenate", "first_per_key", "first_per_key_mask", "merge_sorted", "reduce_groups", "sort_order", "with_shard"]


def with_shard(batch: pa.RecordBatch, shard: int) -> pa.RecordBatch:
    """Add the map shard column `s` (a run's rows all come from one shard) if it is missing."""
    if "s" in batch.schema.names:
        return batch
    column = pa.array(np.full(batch.num_rows, shard, dtype=np.int32))
    return batch.add_column(batch.schema.get_field_index("pos"), "s", column)


def sort_order(table: pa.Table, leading: str | None = None) -> np.ndarray:
    """Row order by ([leading,] h, kb, sv, s, pos). NumPy's lexsort on ([leading,] h, s, pos)
    when no sort value is involved and equal hashes only ever mean equal key bytes; Arrow's
    multi-column sort otherwise."""
    names = table.schema.names
    h = _numpy(table, "h")
    if "sv" not in names:
        minor = [_numpy(table, c) for c in ("pos", "s") if c in names]
        major = [_numpy(table, leading)] if leading else []
        order = np.lexsort((*minor, h, *major))
        if not _has_collisions(table, h, order):
            return order
    keys = [(c, "ascending") for c in ((leading,) if leading else ()) + ("h", "kb", "sv", "s", "pos") if c in names]
    return pc.sort_indices(table, sort_keys=keys).to_numpy()


def _numpy(table, name: str) -> np.ndarray:
    column = table.column(name)
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    return column.to_numpy()


def _has_collisions(table, h: np.ndarray, order: np.ndarray) -> bool:
    """Whether two different key bytes share a hash among these rows (then h alone cannot order)."""
    hs = h[order]
    same = np.flatnonzero(hs[1:] == hs[:-1])
    if not len(same):
        return False
    kb = table.column("kb")
    left = kb.take(pa.array(order[same]))
    right = kb.take(pa.array(order[same + 1]))
    return not pc.all(pc.equal(left, right)).as_py()


class _Cursor:
    """One sorted source: its current batch and how far into it the merge has taken."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches = batches
        self.batch: pa.RecordBatch | None = None
        self.start = 0
        self.advance()

    def advance(self) -> None:
        self.batch, self.start = None, 0
        for batch in self._batches:
            if batch.num_rows:
                self.batch, self.h = batch, batch.column("h").to_numpy()
                return

    def key(self, row: int) -> tuple:
        return tuple(self.batch.column(c)[row].as_py() for c in _key_columns(self.batch))

    def take_until(self, frontier: tuple) -> pa.RecordBatch:
        """Rows from `start` whose full key is <= frontier (the batch is sorted)."""
        h = np.uint64(frontier[0])
        lo = self.start + int(np.searchsorted(self.h[self.start :], h, side="left"))
        hi = self.start + int(np.searchsorted(self.h[self.start :], h, side="right"))
        cut = lo + sum(1 for row in range(lo, hi) if self.key(row) <= frontier)
        piece = self.batch.slice(self.start, cut - self.start)
        self.start = cut
        if self.start == self.batch.num_rows:
            self.advance()
        return piece


def _key_columns(batch) -> tuple[str, ...]:
    return tuple(c for c in ("h", "kb", "sv", "s", "pos") if c in batch.schema.names)


def merge_sorted(sources: list[Iterator[pa.RecordBatch]], schema: pa.Schema) -> Iterator[pa.Table]:
    """Sorted chunks of the union of sorted sources that share `schema` (see the module doc)."""
    cursors = [c for c in (_Cursor(s) for s in sources) if c.batch is not None]
    while cursors:
        if len(cursors) == 1:  # one source left: its batches are already in order
            cursor = cursors[0]
            yield pa.Table.from_batches([cursor.batch.slice(cursor.start)], schema=schema)
            cursor.advance()
            cursors = [c for c in cursors if c.batch is not None]
            continue
        frontier = min(c.key(c.batch.num_rows - 1) for c in cursors)
        pieces = [c.take_until(frontier) for c in cursors]
        cursors = [c for c in cursors if c.batch is not None]
        table = pa.Table.from_batches([p for p in pieces if p.num_rows], schema=schema)
        yield table.take(pa.array(sort_order(table)))


def _group_starts(table: pa.Table, previous: tuple | None) -> np.ndarray:
    """A boolean per row: does it start a new key (vs the row before, or the last chunk's)?"""
    h = _numpy(table, "h")
    if not len(h):
        return np.zeros(0, dtype=bool)
    starts = np.empty(len(h), dtype=bool)
    starts[1:] = h[1:] != h[:-1]
    kb = table.column("kb")
    same = np.flatnonzero(~starts[1:]) + 1
    if len(same):  # equal hashes: a new key only if the key bytes differ
        differ = pc.not_equal(kb.take(pa.array(same)), kb.take(pa.array(same - 1))).to_numpy(zero_copy_only=False)
        starts[same[differ]] = True
    starts[0] = previous is None or (int(h[0]), kb[0].as_py()) != previous
    return starts


def first_per_key_mask(table: pa.Table) -> np.ndarray:
    """True for the first row of each key in a sorted table."""
    return _group_starts(table, None)


def _last_key(table: pa.Table) -> tuple:
    n = table.num_rows - 1
    return int(table.column("h")[n].as_py()), table.column("kb")[n].as_py()


def _payload_records(table: pa.Table) -> list:
    description = _description(table.schema)
    columns = [table.column(f"c{i}") for i in range(len(description["names"]))]
    return records_of([c.combine_chunks() if isinstance(c, pa.ChunkedArray) else c for c in columns], description)


def _description(schema: pa.Schema) -> dict:
    import orjson

    return orjson.loads(schema.metadata[FIELDS_META])


def first_per_key(chunks: Iterator[pa.Table]) -> Iterator[Any]:
    """Deduplicate: the first row of each key (rows arrive by shard and position within a key)."""
    previous = None
    for table in chunks:
        starts = _group_starts(table, previous)
        previous = _last_key(table)
        if starts.all():
            yield from _payload_records(table)
        elif starts.any():
            yield from _payload_records(table.take(pa.array(np.flatnonzero(starts))))


def concatenate(chunks: Iterator[pa.Table]) -> Iterator[Any]:
    for table in chunks:
        yield from _payload_records(table)


def reduce_groups(chunks: Iterator[pa.Table], reducer: Callable[..., Any]) -> Iterator[Any]:
    """`reducer(key, items)` per key; a key's items stream across chunks, never held whole."""
    yields_many = inspect.isgeneratorfunction(reducer)

    def rows() -> Iterator[tuple[int, Any, Any]]:
        previous, group = None, 0
        for table in chunks:
            starts = _group_starts(table, previous)
            previous = _last_key(table)
            kb = table.column("kb")
            for i, (start, item) in enumerate(zip(starts.tolist(), _payload_records(table))):
                if start:
                    group += 1
                    key = key_of(kb[i].as_py())
                yield group, key, item

    for _, members in itertools.groupby(rows(), key=lambda r: r[0]):
        first = next(members)
        items = itertools.chain([first[2]], (r[2] for r in members))
        result = reducer(first[1], items)
        if yields_many:
            yield from result
        else:
            yield result
