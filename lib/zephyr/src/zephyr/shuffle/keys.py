"""Shuffle keys: a canonical byte encoding, and a 64-bit hash computed a batch at a time.

Every shuffled record carries `kb`, the canonical bytes of its key (`zephyr.canonical.key_bytes`:
equal keys, equal bytes, in any process), and `h`, a 64-bit hash of `kb`. The partition is `h % num_partitions`; inside a
partition records are ordered by `(h, kb, sort value, origin)`, so equal keys are
adjacent and a partition can be cut into key ranges at any `h` boundary without splitting a key.
`h` only spreads and orders records: equality is always decided on `kb`.

The hash is xxHash64 (the published algorithm, seeded with `SEED`) of `kb`'s bytes, computed a
column at a time in native code (the `polars-hash` plugin over a Polars Binary column), the
same in every process and on every machine (unlike Python's salted `hash` or Polars' own
`Series.hash`, which may change between Polars versions). Both paths hash one column: the
frame path the key bytes Polars builds, the record path a column built from its batch's
`bytes`; a batch of a few hundred keys or fewer (a first chunk, `partition_of`) is hashed a key
at a time by the `xxhash` package (the same function, the C library's), which costs ~0.3 us a key
where a column costs ~0.2 ms a call. The seed keeps `h` apart from the `hash` expression (`zephyr.expr.functions`:
xxHash64 with seed 0 over the same bytes), so data sampled by `hash(key) % m` still spreads
over every partition.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import polars as pl
import polars_hash  # noqa: F401  (registers the `nchash` namespace on Polars expressions)
import pyarrow as pa
import xxhash

from zephyr.canonical import key_bytes

__all__ = ["HASH_SPACE", "PER_KEY_MAX", "SEED", "hash_key_bytes", "hash_keys", "key_bytes", "key_column_of", "partition_of",
           "split_points", "splitmix64"]

HASH_SPACE = 1 << 64
SEED = 0x9E3779B97F4A7C15  # any fixed value but 0 (the `hash` expression's); part of SCRATCH_FORMAT
PER_KEY_MAX = 512  # keys hashed one by one below a column: a column call costs ~0.2 ms, a key ~0.3 us
_HASH = pl.col("kb").nchash.xxhash64(seed=SEED)  # built once; a call still costs ~0.2 ms CPU (a chunk is ~1 MiB)


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 values: a bijection that spreads every input bit."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_keys(kb: pl.Series) -> np.ndarray:
    """The 64-bit hashes (uint64) of a Binary column of canonical key encodings (no nulls)."""
    return kb.to_frame("kb").select(_HASH).to_series().to_numpy()


def hash_key_bytes(kbs: Sequence[bytes]) -> np.ndarray:
    """`hash_keys` of a batch of key encodings held as Python `bytes` (a small batch key by key)."""
    if len(kbs) <= PER_KEY_MAX:
        return np.fromiter((xxhash.xxh64_intdigest(kb, SEED) for kb in kbs), dtype=np.uint64, count=len(kbs))
    return hash_keys(pl.Series(kbs, dtype=pl.Binary))


def key_column_of(kb: pl.Series) -> tuple[pa.Array, np.ndarray]:
    """(a Binary column of key bytes as the large_binary Arrow array runs hold, its hashes)."""
    return kb.to_arrow(compat_level=pl.CompatLevel.oldest()).cast(pa.large_binary()), hash_keys(kb)


def partition_of(kb: bytes, num_partitions: int) -> int:
    """The partition of one key: stable across processes and machines."""
    return int(hash_key_bytes([kb])[0] % np.uint64(num_partitions))


def split_points(first_hashes: np.ndarray, rows: np.ndarray, pieces: int) -> list[int]:
    """Hash boundaries that cut a partition into about `pieces` ranges of equal rows.

    `first_hashes`/`rows` describe the partition's sorted batches (the first hash of each and
    its row count). A boundary is always a batch's first hash, so every key (one hash) stays
    inside one range. Returns the inner boundaries, increasing and distinct (maybe fewer).
    """
    order = np.argsort(first_hashes, kind="stable")
    hashes, counts = first_hashes[order], rows[order]
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1]) if len(cumulative) else 0
    points: list[int] = []
    for i in range(1, pieces):
        at = int(np.searchsorted(cumulative, total * i / pieces, side="left"))
        if at + 1 < len(hashes):
            point = int(hashes[at + 1])
            if point > 0 and (not points or point > points[-1]):
                points.append(point)
    return points
