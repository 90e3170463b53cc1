"""Shuffle keys: a canonical byte encoding, and a 64-bit hash computed a batch at a time.

Every shuffled record carries `kb`, the canonical bytes of its key (`zephyr.canonical.key_bytes`:
equal keys, equal bytes, in any process), and `h`, a 64-bit hash of `kb`. The partition is `h % num_partitions`; inside a
partition records are ordered by `(h, kb, sort value, origin)`, so equal keys are
adjacent and a partition can be cut into key ranges at any `h` boundary without splitting a key.
`h` only spreads and orders records: equality is always decided on `kb`.

The hash is CRC-32 of `kb` (with its length) through the splitmix64 finalizer: the CRC is one
C call per key (`map(zlib.crc32, ...)`), the mixing is vectorized in NumPy, and both are the
same in every process and on every machine (unlike Python's salted `hash`).
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence

import numpy as np

from zephyr.canonical import key_bytes

__all__ = ["HASH_SPACE", "hash_key_array", "hash_key_bytes", "key_bytes", "partition_of", "split_points", "splitmix64"]

HASH_SPACE = 1 << 64


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 values: a bijection that spreads every input bit."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _mix(crc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """splitmix64 over (crc | length << 32): uniform 64-bit values."""
    return splitmix64(crc.astype(np.uint64) | (lengths.astype(np.uint64) << np.uint64(32)))


def hash_key_bytes(kbs: Sequence[bytes]) -> np.ndarray:
    """The 64-bit hashes (uint64) of a batch of canonical key encodings."""
    n = len(kbs)
    crc = np.fromiter(map(zlib.crc32, kbs), dtype=np.uint32, count=n)
    lengths = np.fromiter(map(len, kbs), dtype=np.int64, count=n)
    return _mix(crc, lengths)


def hash_key_array(kb) -> np.ndarray:
    """`hash_key_bytes` of a large_binary Arrow array of key bytes (its lengths from its
    offsets, not from a Python object per key)."""
    n = len(kb)
    crc = np.fromiter(map(zlib.crc32, kb.to_pylist()), dtype=np.uint32, count=n)
    _, offsets, _ = kb.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64, count=kb.offset + n + 1)[kb.offset :]
    return _mix(crc, np.diff(bounds))


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
