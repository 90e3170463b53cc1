"""LSH buckets to candidate edges, and connected components by alternating star operations.

Items flowing between the shuffles are tagged tuples:
- `(DOC, id, record)`: a document, grouped under its own id in every round, so it travels with
  its node and the last round can decide its fate;
- `(EDGE, node, other)`: one direction of an undirected candidate edge, grouped under `node`;
- `(BAND, (band, bucket), id)`: a document's bucket in one band, grouped under the bucket.

A document id is `shard << 40 | position` (input shard, then position), so the smallest id of a
component is its first document by (input shard, position): the one kept.

Every reducer streams its group once, items ordered by `sort_key` (the document first, then
neighbours ascending), holding O(1) state: a bucket of a million identical pages links each
member to the bucket's first one (a star: O(n) edges, never n**2 pairs), and a node of huge
degree is read, never held. Components come from the large-star / small-star alternation
(Kiveris et al., "Connected Components in MapReduce and Beyond", 2014): both keep every
component connected and together converge to one star per component centred on its smallest
node. `resolve` checks locally that the graph has become such a star forest (every node has
either no smaller neighbour, or exactly one and no larger one) and raises otherwise, so a
result is never silently wrong: more rounds (`cc_rounds`) fix it, and a rerun reuses the
earlier stages.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["BAND", "DOC", "EDGE", "NotConvergedError", "bucket_or_doc", "doc_id", "large_star", "node_of", "resolve", "small_star", "sort_key", "star_reducers"]

DOC, EDGE, BAND = 0, 1, 2
_SHARD_SHIFT = 40


class NotConvergedError(RuntimeError):
    """The star rounds ended before every component became one star: raise `cc_rounds`."""


def doc_id(shard: int, position: int) -> int:
    return shard << _SHARD_SHIFT | position


def doc_position(ident: int) -> tuple[int, int]:
    """(input shard, position) of a document id."""
    return ident >> _SHARD_SHIFT, ident & ((1 << _SHARD_SHIFT) - 1)


def node_of(item: tuple) -> Any:
    """The group key: a document's or edge's node, a band item's (band, bucket)."""
    return item[1]


def sort_key(item: tuple) -> int:
    """Within a group: the document first, then neighbours (or bucket members) ascending."""
    return -1 if item[0] == DOC else item[2]


def _edge(u: int, v: int) -> Iterator[tuple]:
    yield (EDGE, u, v)
    yield (EDGE, v, u)


def _neighbours(items: Iterator[tuple], docs: list) -> Iterator[int]:
    """The distinct neighbours of a group in ascending order; its document goes into `docs`."""
    previous = None
    for item in items:
        if item[0] == DOC:
            docs.append(item)
            continue
        v = item[2]
        if v != previous:
            previous = v
            yield v


def bucket_or_doc(key: Any, items: Iterator[tuple]) -> Iterator[tuple]:
    """A document passes on; a bucket links every member to its first (smallest id) member."""
    first = next(items)
    if first[0] == DOC:
        yield first
        return
    root = first[2]
    for item in items:
        if item[2] != root:
            yield from _edge(root, item[2])


def large_star(u: int, items: Iterator[tuple]) -> Iterator[tuple]:
    """Link every larger neighbour of u to the smallest of u and its neighbours."""
    docs: list = []
    m = None
    for v in _neighbours(items, docs):
        if m is None:
            m = min(u, v)
        if v > u:
            yield from _edge(v, m)
    yield from docs


def small_star(u: int, items: Iterator[tuple]) -> Iterator[tuple]:
    """Link u and its smaller neighbours to the smallest of them (larger neighbours do it from their side)."""
    docs: list = []
    m = u
    for v in _neighbours(items, docs):
        if v >= u:
            continue  # larger neighbours: emitted from their own group
        if m == u:
            m = v  # ascending: the first smaller neighbour is the smallest
        elif v != m:
            yield from _edge(v, m)
    if m != u:
        yield from _edge(u, m)
    yield from docs


def resolve(u: int, items: Iterator[tuple], *, annotate: bool, cluster_field: str, kept_field: str, rounds: int) -> Iterator[Any]:
    """The last reducer: label each document with its component's smallest id, then keep,
    drop or annotate it. Raises NotConvergedError where the edges are not yet a star forest.
    (A generator function, bound with `functools.partial`, so group_by streams what it yields.)"""
    docs: list = []
    smaller, larger = [], False
    for v in _neighbours(items, docs):
        if v < u:
            smaller.append(v)
            if len(smaller) > 1:
                break
        else:
            larger = True
            break
    if len(smaller) > 1 or (smaller and larger):
        shard, pos = doc_position(u)
        raise NotConvergedError(
            f"deduplicate_fuzzy: connected components did not converge in cc_rounds={rounds} "
            f"(document {pos} of input shard {shard} still links to several nodes); rerun with a larger "
            "cc_rounds (the signature and bucket stages are reused)"
        )
    label = smaller[0] if smaller else u
    for item in docs:  # the group's document (every node id comes from one)
        if annotate:
            yield _annotated(item[2], label, cluster_field, kept_field)
        elif label == u:
            yield item[2]


def _annotated(record: Any, label: int, cluster_field: str, kept_field: str) -> dict:
    if not isinstance(record, dict):
        raise TypeError(f"deduplicate_fuzzy(annotate=True) adds fields to dict records, got {type(record).__name__}: {record!r:.80}")
    shard, pos = doc_position(label)
    return {**record, cluster_field: label, kept_field: [shard, pos]}


def star_reducers(rounds: int) -> list[Callable]:
    """The alternation of `rounds` star operations, large first."""
    return [large_star if i % 2 == 0 else small_star for i in range(rounds)]
