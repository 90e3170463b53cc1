"""`Dataset.deduplicate_fuzzy` as a chain of ordinary zephyr stages (so plans print it, runs
resume it stage by stage and skewed partitions split like any shuffle's):

1. signatures (map_shard): documents go into blocks of `components.BLOCK`, pickled and
   compressed once; their MinHash band keys, a few thousand documents at a time, become local
   bucket stars (edges) and one (key, smallest id) pair per bucket for its bucket group;
2. buckets (group_by on the bucket group): each group links its buckets' map-shard roots;
3. star rounds (group_by on node), alternating large-star and small-star, as many as the data
   needs (a `GroupByRounds` op, which `Dataset.deduplicate_fuzzy` makes of `apply`'s fields: the
   runner adds a round while the last one found a node not yet in a star), at most `cc_rounds`
   (default `DEFAULT_MAX_CC_ROUNDS`);
4. apply (group_by on node, where a block meets its nodes' labels): documents are kept,
   dropped or annotated.

Only small integer tuples go through the bucket and component rounds; a block passes through
them unopened (the plan is one linear chain, so it rides along; see docs/zephyr.md for the
bytes).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np

from zephyr.dedup import components as cc
from zephyr.dedup import report
from zephyr.dedup.minhash import MinHasher
from zephyr.errors import NotConvergedError
from zephyr.naming import callable_name
from zephyr.shuffle import origin as origins
from zephyr.tasks import ShardInfo

__all__ = ["DEFAULT_MAX_CC_ROUNDS", "DEFAULT_NUM_PERMS", "FuzzyParams", "apply"]

DEFAULT_NUM_PERMS = 220
# The most star rounds by default. A chain of n documents, the slowest shape measured, settles in
# about 2 log2(n) + 1 rounds (20 for 10^3, 28 for 10^4: benchmarks/README.md section 24): 128 covers chains far longer
# than a corpus can hold (2^60 documents), and a round that is not needed never runs.
DEFAULT_MAX_CC_ROUNDS = 128
BUCKET_GROUPS_PER_SHARD = 16  # bucket groups per bucket-stage shard: bounds a group's pairs
_SIGNATURE_BATCH = 16 * cc.BLOCK  # documents whose band keys are sorted together on the map side


@dataclass(frozen=True)
class FuzzyParams:
    """Everything that decides which documents `deduplicate_fuzzy` keeps."""

    ngram: int
    bands: int
    rows: int
    seed: int
    cc_rounds: int  # the most star rounds (the runner stops as soon as they settle)
    annotate: bool
    cluster_field: str
    kept_field: str
    num_output_shards: int | None


@dataclass(frozen=True)
class Signatures:
    """map_shard fn: blocks of documents, local bucket stars and bucket-group pairs."""

    text: Callable[[Any], str]
    hasher: MinHasher
    bucket_shards: int | None  # the bucket stage's shard count (None: as many as the input)
    annotate_fields: tuple[str, str] | None = None  # annotate=True: (cluster, kept) fields, checked here

    def __call__(self, items: Iterable[Any], info: ShardInfo) -> Iterator[tuple]:
        shard = info.shard_idx
        groups = BUCKET_GROUPS_PER_SHARD * (self.bucket_shards or info.total_shards)
        origin = origins.current()  # where the stage reads a shuffle: each record's origin (wide ids)
        block: list = []
        block_origins: list | None = None if origin is None else []
        signatures: list = []
        ids: list = []
        position = -1
        for position, record in enumerate(items):
            if len(block) == cc.BLOCK:
                yield cc.docs_block(shard, position - cc.BLOCK, block, block_origins)
                block, block_origins = [], None if origin is None else []
                if len(ids) >= _SIGNATURE_BATCH:
                    yield from self._buckets(signatures, ids, groups)
                    signatures, ids = [], []
            ident = cc.doc_id(shard, position)
            if origin is not None:
                block_origins.append(origin.value)
                ident = cc.wide_id(origin.value, ident)
            if self.annotate_fields is not None:
                cc.check_annotatable(record, ident, self.annotate_fields)
            block.append(record)
            text = self.text(record)
            if not isinstance(text, str):
                raise TypeError(
                    f"deduplicate_fuzzy text function {callable_name(self.text)} must return a str; got "
                    f"{type(text).__name__} for record {position} of shard {shard}: {record!r:.120}"
                )
            signature = self.hasher.signature(text)
            if signature is not None:
                signatures.append(signature)
                ids.append(ident)
        report.count("documents_in", position + 1)
        if block:
            yield cc.docs_block(shard, position + 1 - len(block), block, block_origins)
        yield from self._buckets(signatures, ids, groups)

    def _buckets(self, signatures: list, ids: list, groups: int) -> Iterator[tuple]:
        if not ids:
            return
        keys = self.hasher.band_key_matrix(np.stack(signatures))
        ranks, lookup = cc.ranked(ids)
        doc_ids = np.repeat(ranks, self.hasher.bands)
        yield from cc.local_stars(keys.reshape(-1), doc_ids, groups, lookup)

    def name_for_plan(self) -> str:
        h = self.hasher
        return f"minhash({callable_name(self.text)}, ngram={h.ngram}, {h.bands}x{h.rows}, seed={h.seed})"


class _Bound(functools.partial):
    """A reducer bound to its options: still a generator function to group_by (which unwraps
    partials), and named in plans."""

    def name_for_plan(self) -> str:
        options = ", ".join(f"{k}={v!r}" for k, v in self.keywords.items() if k == "annotate")
        return f"{self.func.__name__}({options})"


def not_converged(rounds: int, unsettled: int) -> NotConvergedError:
    """The error of star rounds that used their budget before the components settled."""
    return NotConvergedError(
        f"deduplicate_fuzzy: connected components did not converge in cc_rounds={rounds} rounds ({unsettled} documents "
        f"still linked to several others in round {rounds}); rerun with a larger cc_rounds (None: at most "
        f"{DEFAULT_MAX_CC_ROUNDS}): the signature and bucket stages and the finished rounds are reused"
    )


def apply(dataset, text: Callable[[Any], str], params: FuzzyParams) -> tuple[Any, dict]:
    """The signature and bucket stages appended to `dataset` (lazy), and the fields of the
    `GroupByRounds` op that follows them (the plan layer makes it): the component rounds and
    the last stage."""
    n = params.num_output_shards
    hasher = MinHasher(params.ngram, params.bands, params.rows, params.seed)
    fields = (params.cluster_field, params.kept_field) if params.annotate else None
    ds = dataset.map_shard(Signatures(text, hasher, n, fields))
    ds = ds.group_by(cc.node_of, cc.link_buckets, sort_by=cc.sort_key, num_output_shards=n)
    final = _Bound(cc.apply_labels, annotate=params.annotate, cluster_field=params.cluster_field, kept_field=params.kept_field)
    rounds = {"key": cc.node_of, "reducers": cc.STAR_REDUCERS, "final": final, "counter": cc.UNSETTLED,
              "max_rounds": params.cc_rounds, "exhausted": not_converged, "sort_by": cc.sort_key, "num_output_shards": n,
              "name": "cc"}
    return ds, rounds
