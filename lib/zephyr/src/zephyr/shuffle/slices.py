"""The reduce side's merge of sorted columnar runs in hash-range slices, each sorted in one go.

Each source is a sorted stream of record batches (one partition, or one key range of it, from
one run). Hashes are uniform over the task's key range, so the range is cut at *targets*
spaced to hold about `budget` bytes of the task's runs each. For a slice every source reads
ahead until its last hash reaches the target; no unread row can then have a smaller hash, so
the held rows below the target are all the rows of their keys. They become one slice, ordered
by `merge.sort_order` (a stable sort on the hash; Arrow's multi-column sort where hashes
collide or a sort value is involved) and handed on as one `merge.Chunk`. A key never spans two
slices and slices come in hash order: the output is the same rows in the same order as a
row-by-row k-way merge.

A merge that takes one batch per source per round (`merge.merge_sorted`) pays Python work per
source per round: with 32 runs, 2M documents took ~1,200 rounds and ~35,000 cursor steps, an
eighth of the job's CPU with the sort (benchmarks/README.md, section 26). Slices of a
sixteenth of the task's memory take a few per task. Memory: a source stops reading ahead at
twice its share of the budget (a dense hash range), and the slice is then cut lower, at the
smallest last hash such a source holds (the same argument: nothing unread sorts below it); the
held batches and the slice's concatenated copy are all a slice holds. When a source's whole
read-ahead is one hash (a hot key of a `group_by` without a combiner: a deduplicate's runs hold
each key once), no slice can be cut: the rest of the task then takes the batch-per-round merge,
which holds one batch per source whatever the groups, and the run says so
(`zephyr/shuffle_slice_fallbacks`, a warning).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import pyarrow as pa

from zephyr import counters
from zephyr.shuffle.keys import HASH_SPACE
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

    def fill(self, target: int | None, cap: int) -> bool:
        """Read ahead until the last hash held reaches `target` (None: to the end), or `cap`
        bytes are held; whether it stopped short of the target (at the cap)."""
        while not self.done and (not self.held or target is None or self.last_hash() < target):
            if self.bytes >= cap:
                return True
            batch = next(self._batches, None)
            if batch is None:
                self.done = True
            elif batch.num_rows:
                self.held.append(batch)
                self.bytes += batch.nbytes
        return False

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


def merge_slices(sources: list[Iterator[pa.RecordBatch]], schema: pa.Schema, budget: int, total: int = 0,
                 lo: int = 0, hi: int | None = None) -> Iterator[Chunk]:
    """Sorted chunks of the union of sorted sources that share `schema`, whose `total` bytes have
    hashes in [lo, hi), a slice of about `budget` bytes at a time (see the module doc)."""
    opened = [_Source(s) for s in sources]
    hi = HASH_SPACE if hi is None else hi
    step = max(1, (hi - lo) // max(1, -(-total // max(1, budget))))
    cap = max(2 * BATCH_BYTES, 2 * budget // max(1, len(opened)))
    target = _next(lo, step, hi)
    while True:
        short = [s.last_hash() for s in opened if s.fill(target, cap)]
        live = any(not s.done for s in opened)
        frontier = min(short) if short else (target if live else None)
        pieces = [piece for s in opened for piece in s.below(frontier)]
        if pieces:
            table = pa.Table.from_batches(pieces, schema=schema).combine_chunks()
            del pieces
            counters.increment("zephyr/shuffle_slices")
            yield Chunk(table, sort_order(table))
        elif frontier is None:
            return
        elif short:  # a source's read-ahead is all one hash: merge the rest a batch per round
            counters.increment("zephyr/shuffle_slice_fallbacks")
            logger.warning("shuffle reduce: the rows of one key hash fill a run's read-ahead (%d bytes); "
                           "merging the rest of this task a batch at a time", cap)
            yield from merge_sorted([s.rest() for s in opened], schema)
            return
        if not short and target is not None:
            target = _next(target, step, hi)


def _next(target: int, step: int, hi: int) -> int | None:
    """The next slice's target hash; None for the last slice (everything left)."""
    return None if target + step >= hi else target + step
