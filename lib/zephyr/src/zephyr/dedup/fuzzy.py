"""`Dataset.deduplicate_fuzzy` as a chain of ordinary zephyr stages (so plans print it, runs
resume it stage by stage and skewed partitions split like any shuffle's):

1. signatures: each document is tagged with its id (input shard, position) and emits itself
   plus one (band, bucket) item per LSH band;
2. buckets (group_by on (band, bucket)): each bucket links its members to its first one;
3. `cc_rounds` star rounds (group_by on node), alternating large-star and small-star;
4. resolve (group_by on node): each document learns its component's first document and is
   kept, dropped or annotated.

Documents travel with their node through every shuffle, which keeps the stages a single linear
chain (no side input); the cost is their bytes once per shuffle (see docs/zephyr.md).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from zephyr.dedup import components as cc
from zephyr.dedup.minhash import MinHasher
from zephyr.naming import callable_name
from zephyr.tasks import ShardInfo

__all__ = ["DEFAULT_CC_ROUNDS", "DEFAULT_NUM_PERMS", "FuzzyParams", "apply"]

DEFAULT_NUM_PERMS = 220
DEFAULT_CC_ROUNDS = 4


@dataclass(frozen=True)
class FuzzyParams:
    """Everything that decides which documents `deduplicate_fuzzy` keeps."""

    ngram: int
    bands: int
    rows: int
    seed: int
    cc_rounds: int
    annotate: bool
    cluster_field: str
    kept_field: str
    num_output_shards: int | None


@dataclass(frozen=True)
class Signatures:
    """map_shard fn: each document, then its band buckets (documents without words get none)."""

    text: Callable[[Any], str]
    hasher: MinHasher

    def __call__(self, items: Iterable[Any], info: ShardInfo) -> Iterator[tuple]:
        for position, record in enumerate(items):
            ident = cc.doc_id(info.shard_idx, position)
            yield (cc.DOC, ident, record)
            text = self.text(record)
            if not isinstance(text, str):
                raise TypeError(
                    f"deduplicate_fuzzy text function {callable_name(self.text)} must return a str; got "
                    f"{type(text).__name__} for record {position} of shard {info.shard_idx}: {record!r:.120}"
                )
            signature = self.hasher.signature(text)
            if signature is not None:
                for band, bucket in enumerate(self.hasher.band_keys(signature)):
                    yield (cc.BAND, (band, bucket), ident)

    def name_for_plan(self) -> str:
        h = self.hasher
        return f"minhash({callable_name(self.text)}, ngram={h.ngram}, {h.bands}x{h.rows}, seed={h.seed})"


class _Resolve(functools.partial):
    """`components.resolve` bound to its options: still a generator function to group_by
    (which unwraps partials), and named in plans."""

    def name_for_plan(self) -> str:
        return "resolve(annotate=True)" if self.keywords.get("annotate") else "resolve"


def apply(dataset, text: Callable[[Any], str], params: FuzzyParams):
    """The stages of near-duplicate removal appended to `dataset` (lazy)."""
    n = params.num_output_shards
    ds = dataset.map_shard(Signatures(text, MinHasher(params.ngram, params.bands, params.rows, params.seed)))
    ds = ds.group_by(cc.node_of, cc.bucket_or_doc, sort_by=cc.sort_key, num_output_shards=n)
    for reducer in cc.star_reducers(params.cc_rounds):
        ds = ds.group_by(cc.node_of, reducer, sort_by=cc.sort_key, num_output_shards=n)
    final = _Resolve(
        cc.resolve, annotate=params.annotate, cluster_field=params.cluster_field, kept_field=params.kept_field, rounds=params.cc_rounds
    )
    return ds.group_by(cc.node_of, final, sort_by=cc.sort_key, num_output_shards=n)
