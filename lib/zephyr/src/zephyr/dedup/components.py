"""LSH buckets to candidate edges, connected components by alternating star operations, and
the labels joined back to the documents.

Items flowing between the shuffles are tagged tuples; the group key is always `item[1]`:
- `(DOCS, ("d", shard, block), first_id, payload, origins)`: a block of up to `BLOCK`
  consecutive documents of one shard of the signature stage, pickled and compressed once there
  (with their origins as int64 bytes where the stage reads a shuffle, else None); every later
  stage passes it on unopened (a few hundred bytes of header per block), until the last opens
  it and meets its labels there;
- `(BANDS, ("b", group), keys, roots)`: a map shard's distinct bucket keys of one bucket group
  (uint64 bytes) with the smallest document id of each within that map shard (int64 bytes, or
  two int64 per id where ids are wide);
- `(EDGE, node, other)`: one direction of an undirected candidate edge, grouped under `node`;
- `(LABEL, block, node, root)`: what a round found `node`'s component to be if the graph has
  settled, grouped under `node`'s block (so with the block itself): used by the last stage when
  the round's count says the graph had settled, dropped by the next round otherwise.

A document id is its origin (`zephyr.shuffle.origin`: `shard << 40 | position` in the
pipeline's input) where the signature stage reads its source, and `(origin + 1) << 64 | local`
where it reads a shuffle (`local` is `shard << 40 | position` in the signature stage, which
places the document's block; ids stay unique if two documents share an origin). Either way the
smallest id of a component is its first document in the input: the one kept. Only documents
with a candidate edge appear in the component rounds, as integer pairs; the NumPy steps work on
wide ids through their ranks.

LSH buckets are computed in blocks, vectorised: the signature stage sorts its (bucket key, id)
pairs, links each bucket's members in that map shard to the smallest (a star, deduplicated
over the bands) and sends one (key, smallest) pair per bucket to the bucket group
`key % groups`; the bucket stage does the same across map shards. A bucket of a million
identical pages is then O(map shards) pairs in its group and a star of edges, never n**2 pairs.

Components come from the large-star / small-star alternation (Kiveris et al., "Connected
Components in MapReduce and Beyond", 2014): both keep every component connected and together
converge to one star per component centred on its smallest node, in about 2 log2(n) rounds for
a chain of n documents (measured: benchmarks/README.md section 24). Each reducer streams its group once,
neighbours ascending, holding O(1) state: a node of huge degree is read, never held. Each
round also checks its input: a node with two smaller neighbours, or a smaller and a larger one,
is counted under `UNSETTLED`; the others with a smaller neighbour get a LABEL. A round whose
shards count none had a star forest for input, which every round leaves as it is: the runner
then ends the rounds (`zephyr.plan.rounds`) and the last stage (`apply_labels`) reads that
round's labels. So a result is never silently wrong, and the rounds are as many as the data needs.
"""

from __future__ import annotations

import pickle
from collections.abc import Iterator
from typing import Any

import numpy as np
import zstandard

from zephyr.counters import increment
from zephyr.dedup import report
from zephyr.errors import NotConvergedError  # re-exported: raised for these rounds, defined with the run's errors
from zephyr.shuffle import origin as origins
from zephyr.shuffle.columnar import dumps

__all__ = [
    "BANDS", "BLOCK", "DOCS", "EDGE", "LABEL", "STAR_REDUCERS", "UNSETTLED", "NotConvergedError", "apply_labels", "block_key",
    "check_annotatable", "doc_id", "doc_position", "docs_block", "large_star", "link_buckets", "local_stars", "node_of",
    "origin_of", "small_star", "sort_key", "wide_id",
]

DOCS, EDGE, BANDS, LABEL = 0, 1, 2, 3
_SHARD_SHIFT = origins.SHIFT
_LOCAL_BITS = 64  # of a wide id (see the module doc)
_LOCAL = (1 << _LOCAL_BITS) - 1
BLOCK = 512  # documents per block: a block is pickled, compressed and opened as one
UNSETTLED = "zephyr/cc_unsettled"  # nodes a round found not yet in a star (summed over the rounds in a run's totals)


def doc_id(shard: int, position: int) -> int:
    return shard << _SHARD_SHIFT | position


def wide_id(origin: int, local: int) -> int:
    """The id of a document of origin `origin` at `local` (`doc_id`) in a signature stage that
    reads a shuffle: ordered by origin, and by `local` among equal origins."""
    return (origin + 1) << _LOCAL_BITS | local


def origin_of(ident: int) -> int:
    """The (packed) origin of a document id."""
    return (ident >> _LOCAL_BITS) - 1 if ident >> _LOCAL_BITS else ident


def doc_position(ident: int) -> tuple[int, int]:
    """(input shard, position) of a document id: where it is in the pipeline's input."""
    origin = origin_of(ident)
    return origin >> _SHARD_SHIFT, origin & ((1 << _SHARD_SHIFT) - 1)


def block_key(ident: int) -> tuple:
    """The group key of the block holding document `ident`."""
    local = ident & _LOCAL
    return ("d", local >> _SHARD_SHIFT, (local & ((1 << _SHARD_SHIFT) - 1)) // BLOCK)


def docs_block(shard: int, start: int, records: list, origins_of: list | None = None) -> tuple:
    """The DOCS item of `records`, positions `start`.. of the signature stage's `shard` (start %
    BLOCK == 0), with their packed origins where that stage reads a shuffle."""
    payload = zstandard.ZstdCompressor(level=1).compress(dumps(records))
    packed = None if origins_of is None else np.asarray(origins_of, dtype=np.int64).tobytes()
    return (DOCS, ("d", shard, start // BLOCK), doc_id(shard, start), payload, packed)


def _block_ids(block: tuple, count: int) -> list[int]:
    """The ids of the `count` documents of a DOCS item, in order."""
    local = range(block[2], block[2] + count)
    if block[4] is None:
        return list(local)
    return [wide_id(origin, at) for origin, at in zip(np.frombuffer(block[4], dtype=np.int64).tolist(), local)]


def ranked(ids: list[int]) -> tuple[np.ndarray, list[int] | None]:
    """Document ids as int64 for the NumPy steps: themselves where they fit (narrow ids), else
    their ranks among themselves and the sorted distinct ids the ranks stand for."""
    if not ids or max(ids) >> 63 == 0:
        return np.asarray(ids, dtype=np.int64), None
    distinct = sorted(set(ids))
    rank = {ident: i for i, ident in enumerate(distinct)}
    return np.fromiter(map(rank.__getitem__, ids), dtype=np.int64, count=len(ids)), distinct


def _id_bytes(ids: np.ndarray, lookup: list[int] | None) -> bytes:
    """Ids (or ranks standing for the wide ids in `lookup`) as bytes: int64 each, or two per wide id."""
    if lookup is None:
        return ids.tobytes()
    wide = [lookup[r] for r in ids.tolist()]
    return np.array([(w >> _LOCAL_BITS, w & _LOCAL) for w in wide], dtype=np.int64).reshape(-1, 2).tobytes()


def _ids_of(keys: bytes, ids: bytes) -> list[int] | np.ndarray:
    """The ids `_id_bytes` wrote beside bucket keys: an int64 array, or wide ids (a list)."""
    if len(ids) == len(keys):
        return np.frombuffer(ids, dtype=np.int64)
    return [hi << _LOCAL_BITS | lo for hi, lo in np.frombuffer(ids, dtype=np.int64).reshape(-1, 2).tolist()]


def node_of(item: tuple) -> Any:
    """The group key: a node (its local part: unique, and a 64-bit key that hashes fast where
    ids are wide), a block (a LABEL's is its node's block) or a bucket group."""
    return item[1] & _LOCAL if item[0] == EDGE else item[1]


def sort_key(item: tuple) -> int:
    """Within a group: a block or bucket items first, then neighbours (or labels' nodes) ascending."""
    return item[2] if item[0] == EDGE or item[0] == LABEL else -1


def _edges(u: int, v: int) -> Iterator[tuple]:
    yield (EDGE, u, v)
    yield (EDGE, v, u)


def _star_pairs(keys: np.ndarray, ids: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(distinct keys, smallest id of each, (root, member) pairs linking the other ids of a key
    to its smallest, distinct, sorted)."""
    order = np.lexsort((ids, keys))
    keys, ids = keys[order], ids[order]
    first = np.ones(len(keys), dtype=bool)
    first[1:] = keys[1:] != keys[:-1]
    roots = ids[np.maximum.accumulate(np.where(first, np.arange(len(keys)), 0))]
    members = ~first & (ids != roots)
    a, b = roots[members], ids[members]
    order = np.lexsort((b, a))
    a, b = a[order], b[order]
    distinct = np.ones(len(a), dtype=bool)
    distinct[1:] = (a[1:] != a[:-1]) | (b[1:] != b[:-1])
    return keys[first], ids[first], np.stack([a[distinct], b[distinct]], axis=1)


def local_stars(keys: np.ndarray, ids: np.ndarray, groups: int, lookup: list[int] | None = None) -> Iterator[tuple]:
    """The signature stage's bucket output for (bucket key, id) pairs: edges within the map
    shard, then one BANDS item per bucket group holding each bucket's smallest id. With
    `lookup`, `ids` are ranks standing for the wide ids `lookup` holds (`ranked`)."""
    keys, roots, pairs = _star_pairs(keys, ids)
    yield from _star_edges(pairs, lookup)
    group = keys % np.uint64(groups)
    order = np.argsort(group, kind="stable")
    group, keys, roots = group[order], keys[order], roots[order]
    cuts = np.flatnonzero(group[1:] != group[:-1]) + 1
    for start, end in zip([0, *cuts.tolist()], [*cuts.tolist(), len(group)]):
        if end > start:
            yield (BANDS, ("b", int(group[start])), keys[start:end].tobytes(), _id_bytes(roots[start:end], lookup))


def _star_edges(pairs: np.ndarray, lookup: list[int] | None) -> Iterator[tuple]:
    for root, member in pairs.tolist():
        yield from _edges(root, member) if lookup is None else _edges(lookup[root], lookup[member])


def link_buckets(key: Any, items: Iterator[tuple]) -> Iterator[tuple]:
    """Bucket stage: a bucket group links each bucket's map-shard roots to the smallest of them;
    blocks and edges pass on."""
    first = next(items)
    if first[0] != BANDS:
        yield first
        yield from items
        return
    batches = [first, *items]
    keys = np.concatenate([np.frombuffer(b[2], dtype=np.uint64) for b in batches])
    ids = [_ids_of(b[2], b[3]) for b in batches]
    if all(isinstance(i, np.ndarray) for i in ids):
        ranks, lookup = np.concatenate(ids), None
    else:
        ranks, lookup = ranked([ident for part in ids for ident in part])
    yield from _star_edges(_star_pairs(keys, ranks)[2], lookup)


def _neighbours(items: Iterator[tuple]) -> Iterator[int]:
    """The distinct neighbours of an edge group in ascending order."""
    previous = None
    for item in items:
        v = item[2]
        if v != previous:
            previous = v
            yield v


class _Check:
    """Whether node `u`'s neighbourhood, seen ascending, is settled: no smaller neighbour, or one
    and no larger. O(1) state."""

    __slots__ = ("u", "smaller", "unsettled")

    def __init__(self, u: int):
        self.u, self.smaller, self.unsettled = u, None, False

    def see(self, v: int) -> None:
        if self.smaller is not None:
            self.unsettled = True  # a second smaller neighbour, or a larger one besides the smaller
        elif v < self.u:
            self.smaller = v

    def verdict(self) -> Iterator[tuple]:
        """Count `u` as unsettled, or give it its label if it has a smaller neighbour."""
        if self.unsettled:
            increment(UNSETTLED)
        elif self.smaller is not None:
            yield (LABEL, block_key(self.u), self.u, self.smaller)


def large_star(key: Any, items: Iterator[tuple]) -> Iterator[tuple]:
    """Link every larger neighbour of u to the smallest of u and its neighbours."""
    first = next(items)
    if first[0] != EDGE:  # a block passes on; the previous round's labels go
        if first[0] == DOCS:
            yield first
        return
    u, m = first[1], None  # u: the node itself (`key` is its local part)
    check = _Check(u)
    for v in _neighbours(_chain(first, items)):
        check.see(v)
        if m is None:
            m = min(u, v)
        if v > u:
            yield from _edges(v, m)
    yield from check.verdict()


def small_star(key: Any, items: Iterator[tuple]) -> Iterator[tuple]:
    """Link u and its smaller neighbours to the smallest of them (larger neighbours do it from their side)."""
    first = next(items)
    if first[0] != EDGE:  # a block passes on; the previous round's labels go
        if first[0] == DOCS:
            yield first
        return
    u = m = first[1]  # the node itself (`key` is its local part)
    check = _Check(u)
    for v in _neighbours(_chain(first, items)):
        check.see(v)
        if v >= u:
            break  # ascending: the rest are larger neighbours, emitted from their own groups
        if m == u:
            m = v  # ascending: the first smaller neighbour is the smallest
        elif v != m:
            yield from _edges(v, m)
    if m != u:
        yield from _edges(u, m)
    yield from check.verdict()


STAR_REDUCERS = (large_star, small_star)  # the rounds alternate them, large first


def _chain(first: tuple, items: Iterator[tuple]) -> Iterator[tuple]:
    yield first
    yield from items


def apply_labels(key: Any, items: Iterator[tuple], *, annotate: bool, cluster_field: str, kept_field: str) -> Iterator[Any]:
    """The last reducer, over the output of a round whose input had settled: a block meets the
    labels of its nodes; each document is kept, dropped or annotated by its component's smallest
    id (a document without a label has no smaller neighbour: it is its cluster's first). A node's
    edges, also there (grouped under the node), are not needed."""
    block = next(items)
    if block[0] != DOCS:
        return
    labels = {item[2]: item[3] for item in items}
    records = pickle.loads(zstandard.ZstdDecompressor().decompress(block[3]))
    origin = origins.current()  # a shuffle follows: each document goes on with its own origin
    seen = kept = 0
    try:
        for ident, record in zip(_block_ids(block, len(records)), records):
            label = labels.get(ident, ident)
            if origin is not None:
                origin.value = origin_of(ident)
            seen += 1
            if annotate:
                kept += label == ident
                yield _annotated(record, ident, label, cluster_field, kept_field)
            elif label == ident:
                kept += 1
                yield record
    finally:  # what was handed on (a consumer may stop early)
        report.count("documents_out", seen if annotate else kept)
        report.count("duplicates", seen - kept)


# where their outputs' origins come from (`zephyr.shuffle.reduce.origin_rule`): the rounds' items
# need none (no dedup or group order sees them), the documents of a block each their own
apply_labels.origins = "own"  # type: ignore[attr-defined]
link_buckets.origins = large_star.origins = small_star.origins = "none"  # type: ignore[attr-defined]


def check_annotatable(record: Any, ident: int, fields: tuple[str, str]) -> None:
    """Refuse a record that annotating cannot extend: not a dict, or holding one of the `fields`
    already (its value would be lost). Checked when signatures are made too, so that the run
    fails before its shuffles, not in their last stage."""
    if not isinstance(record, dict):
        raise TypeError(f"deduplicate_fuzzy(annotate=True) adds fields to dict records, got {type(record).__name__}: {record!r:.80}")
    for field in fields:
        if field in record:
            shard, pos = doc_position(ident)
            raise ValueError(
                f"deduplicate_fuzzy(annotate=True): document {pos} of input shard {shard} already has field {field!r}, "
                f"which annotating would overwrite; pass another cluster_field / kept_field: {record!r:.80}"
            )


def _annotated(record: Any, ident: int, label: int, cluster_field: str, kept_field: str) -> dict:
    """`record` with its cluster and kept document added; refuses to overwrite a field it has."""
    check_annotatable(record, ident, (cluster_field, kept_field))
    shard, pos = doc_position(label)
    # the cluster id: the kept document's id, or where ids are wide its 64-bit local part (unique,
    # where two documents made from one item after a shuffle share their origin)
    return {**record, cluster_field: label & _LOCAL, kept_field: [shard, pos]}
