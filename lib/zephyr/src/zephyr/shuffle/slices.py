"""The reduce side's merge of sorted columnar runs in hash-range slices, each sorted in one go.

Each source is a sorted stream of record batches (one partition, or one key range of it, from
one run). Every source reads ahead up to its share of the slice budget; the *frontier* is the
smallest last hash any unfinished source holds. No unread row can have a smaller hash, so the
held rows below the frontier are all the rows of their keys: they become one slice, ordered by
`merge.sort_order` (a stable sort on the hash; Arrow's multi-column sort where hashes collide
or a sort value is involved) and handed on as one `merge.Chunk`. Rows at the frontier wait for
the next slice, so a key never spans two slices and slices come in hash order: the output is
the same rows in the same order as a row-by-row k-way merge.

A merge that takes one batch per source per round (`merge.merge_sorted`) pays Python work per
source per round: with 32 runs, 2M documents took ~1,200 rounds and ~35,000 cursor steps, a
fifth of the job's CPU (benchmarks/README.md, section 26). Slices of a few tens of MiB take a
handful. Memory: the held batches (the budget, plus at most one batch per source) and the
slice's concatenated copy. When the rows of one hash in one source exceed that source's share
(a hot key of a `group_by` without a combiner: a deduplicate's runs hold each key once), no
slice can be cut below the frontier: the rest of the task then takes the batch-per-round merge,
which holds one batch per source whatever the groups, and the run says so
(`zephyr/shuffle_slice_fallbacks`, and a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from zephyr import counters
from zephyr.shuffle.merge import Chunk, merge_sorted, sort_order
from zephyr.shuffle.runs import BATCH_BYTES

__all__ = ["merge_slices"]

logger = logging.getLogger(__name__)


class _Source:
    """One sorted stream: the batches read ahead and not yet handed on."""

    def __init__(self, batches: Iterator[pa.RecordBatch]):
        self._batches = batches
        self.held: list[pa.RecordBatch] = []
        self.bytes = 0
        self.done = False

    def fill(self, share: int) -> None:
        while not self.done and self.bytes < share:
            batch = next(self._batches, None)
            if batch is None:
                self.done = True
            elif batch.num_rows:
                self.held.append(batch)
                self.bytes += batch.nbytes

    def last_hash(self) -> int:
        return int(self.held[-1].column("h")[-1].as_py())

    def below(self, frontier: int | None) -> list[pa.RecordBatch]:
        """Take the held rows whose hash is below `frontier` (all of them when None)."""
        taken = []
        while self.held:
            batch = self.held[0]
            h = batch.column("h").to_numpy()
            cut = len(h) if frontier is None or h[-1] < frontier else int(np.searchsorted(h, np.uint64(frontier), side="left"))
            if cut:
                taken.append(batch.slice(0, cut))
            if cut < len(h):
                self.held[0] = batch.slice(cut)
                break
            self.held.pop(0)
        self.bytes = sum(b.nbytes for b in self.held)
        return taken

    def rest(self) -> Iterator[pa.RecordBatch]:
        yield from self.held
        yield from self._batches


def merge_slices(sources: list[Iterator[pa.RecordBatch]], schema: pa.Schema, budget: int) -> Iterator[Chunk]:
    """Sorted chunks of the union of sorted sources that share `schema`, a slice of about
    `budget` bytes at a time (see the module doc)."""
    opened = [_Source(s) for s in sources]
    share = max(BATCH_BYTES, budget // max(1, len(opened)))
    while True:
        for source in opened:
            source.fill(share)
        live = [s for s in opened if not s.done]
        frontier = min(s.last_hash() for s in live) if live else None
        pieces = [piece for s in opened for piece in s.below(frontier)]
        if pieces:
            table = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
            del pieces
            counters.increment("zephyr/shuffle_slices")
            yield Chunk(table, sort_order(table))
        elif frontier is None:
            return
        else:  # one hash's rows fill a source's share: merge the rest a batch per round
            counters.increment("zephyr/shuffle_slice_fallbacks")
            logger.warning("shuffle reduce: the rows of one key hash fill a source's share of the task's memory "
                           "(%d bytes); merging the rest of this task a batch at a time", share)
            yield from merge_sorted([s.rest() for s in opened], schema)
            return
