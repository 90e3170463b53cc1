"""Shuffle keys: a canonical byte encoding, and a 64-bit hash computed a batch at a time.

Every shuffled record carries `kb`, the canonical bytes of its key (equal keys, equal bytes, in
any process), and `h`, a 64-bit hash of `kb`. The partition is `h % num_partitions`; inside a
partition records are ordered by `(h, kb, sort value, map shard, position)`, so equal keys are
adjacent and a partition can be cut into key ranges at any `h` boundary without splitting a key.
`h` only spreads and orders records: equality is always decided on `kb`.

The hash is CRC-32 of `kb` (with its length) through the splitmix64 finalizer: the CRC is one
C call per key (`map(zlib.crc32, ...)`), the mixing is vectorized in NumPy, and both are the
same in every process and on every machine (unlike Python's salted `hash`).
"""

from __future__ import annotations

import pickle
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

__all__ = ["HASH_SPACE", "hash_key_bytes", "key_bytes", "partition_of", "split_points"]

_STR_TAG = b"s"
HASH_SPACE = 1 << 64


def key_bytes(key: Any) -> bytes:
    """A canonical, process-independent encoding of a key.

    A `str` is `b"s"` + its UTF-8; anything else is `b"j"` + JSON with sorted keys (sets become
    sorted lists), or `b"p"` + a pickle with sets replaced by their sorted elements.
    """
    if type(key) is str:
        try:
            return _STR_TAG + key.encode()
        except UnicodeEncodeError:  # lone surrogates: the generic encodings below keep them
            pass
    canonical = _canonical(key)
    try:
        return b"j" + orjson.dumps(canonical, option=orjson.OPT_SORT_KEYS | orjson.OPT_NON_STR_KEYS)
    except TypeError:
        return b"p" + pickle.dumps(canonical, protocol=5)


class _SortedSet(tuple):
    """A set's elements in a canonical order (their own encodings, sorted)."""


def _canonical(value: Any) -> Any:
    """Sets pickle in hash order, which PYTHONHASHSEED changes per process: sort them."""
    if isinstance(value, (set, frozenset)):
        return _SortedSet(sorted((_canonical(v) for v in value), key=key_bytes))
    if isinstance(value, (list, tuple)) and not isinstance(value, _SortedSet):
        items = [_canonical(v) for v in value]
        return type(value)(items) if type(value) in (list, tuple) else value
    if isinstance(value, dict):
        return {k: _canonical(v) for k, v in value.items()}
    return value


def _mix(crc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over (crc | length << 32): uniform 64-bit values."""
    with np.errstate(over="ignore"):
        z = crc.astype(np.uint64) | (lengths.astype(np.uint64) << np.uint64(32))
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def hash_key_bytes(kbs: Sequence[bytes]) -> np.ndarray:
    """The 64-bit hashes (uint64) of a batch of canonical key encodings."""
    n = len(kbs)
    crc = np.fromiter(map(zlib.crc32, kbs), dtype=np.uint32, count=n)
    lengths = np.fromiter(map(len, kbs), dtype=np.int64, count=n)
    return _mix(crc, lengths)


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
