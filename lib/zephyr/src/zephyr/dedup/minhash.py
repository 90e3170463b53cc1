"""MinHash signatures of word n-gram shingles, and their LSH band keys, vectorised with NumPy.

A document's shingles are the distinct runs of `ngram` consecutive lower-cased words (a text
shorter than that is one shingle). Each word is hashed with CRC-32, a shingle by a fixed
polynomial over its words' hashes, all at once in NumPy; permutation i maps a shingle hash x
to `(a_i * x + b_i) mod 2**64 >> 32` (multiply-shift hashing) and keeps the minimum. Two
documents agree in one signature position with probability equal to the Jaccard similarity of
their shingle sets, so a band of `rows` positions agrees with probability s**rows, and at least
one of `bands` bands with 1 - (1 - s**rows)**bands (the S-curve; see docs/zephyr.md).
Everything is seeded and hashed without Python's salted `hash`, so every process agrees.
"""

from __future__ import annotations

import hashlib
import zlib
from dataclasses import dataclass, field

import numpy as np

__all__ = ["MinHasher", "choose_bands", "collision_probability", "shingle_hashes"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)
_CHUNK = 4096  # shingles hashed at once: bounds a huge document's temporary array to ~CHUNK x perms x 8 bytes


def shingle_hashes(text: str, ngram: int) -> np.ndarray:
    """The distinct 64-bit hashes of `text`'s word `ngram`-grams (empty for a text without words)."""
    words = text.lower().split()
    if not words:
        return np.empty(0, dtype=np.uint64)
    word_hashes = np.fromiter((zlib.crc32(w.encode("utf-8", "surrogatepass")) for w in words), dtype=np.uint64, count=len(words))
    n = min(ngram, len(words))
    count = len(words) - n + 1
    h = np.zeros(count, dtype=np.uint64)
    for j in range(n):  # h = sum_j word[i+j] * GOLDEN**(j+1), wrapping: order-sensitive
        h = (h + word_hashes[j : j + count]) * _GOLDEN
    h ^= h >> np.uint64(31)
    return np.unique(h)


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    """Probability that two documents of Jaccard `similarity` share at least one LSH bucket."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def choose_bands(threshold: float, num_perms: int) -> int:
    """The banding for `threshold`: of every split of `num_perms` into bands x rows, the one
    that finds a pair at `threshold + 0.1` (capped at 0.99) with probability >= 0.999 and, among
    those, merges pairs at `threshold - 0.3` least often. With 0.8 and 220: 20 bands of 11 rows
    (0.9 -> 0.9995, 0.8 -> 0.83, 0.7 -> 0.35, 0.5 -> 0.0097)."""
    high, low = min(threshold + 0.1, 0.99), max(threshold - 0.3, 0.0)
    splits = [(b, num_perms // b) for b in range(1, num_perms + 1)]
    exact = [(b, r) for b, r in splits if b * r == num_perms]  # splits that use every permutation first
    recall_ok = [(b, r) for b, r in exact if collision_probability(high, b, r) >= 0.999]
    recall_ok = recall_ok or [(b, r) for b, r in splits if collision_probability(high, b, r) >= 0.999]
    if not recall_ok:  # too few permutations for that recall: take the best recall there is
        return max(splits, key=lambda br: collision_probability(high, *br))[0]
    return min(recall_ok, key=lambda br: (collision_probability(low, *br), -br[0]))[0]


@dataclass(frozen=True)
class MinHasher:
    """Signatures and band keys for one configuration; picklable, identical in every process."""

    ngram: int
    bands: int
    rows: int
    seed: int = 0
    _a: np.ndarray = field(init=False, repr=False, compare=False)
    _b: np.ndarray = field(init=False, repr=False, compare=False)

    def __post_init__(self) -> None:
        rng = np.random.default_rng(self.seed)
        perms = self.bands * self.rows
        a = rng.integers(0, 2**64, size=perms, dtype=np.uint64, endpoint=False) | np.uint64(1)
        b = rng.integers(0, 2**64, size=perms, dtype=np.uint64, endpoint=False)
        object.__setattr__(self, "_a", a)
        object.__setattr__(self, "_b", b)

    def __reduce__(self):
        return (MinHasher, (self.ngram, self.bands, self.rows, self.seed))

    def signature(self, text: str) -> np.ndarray | None:
        """The uint32 MinHash signature (bands*rows values), or None for a text without words."""
        shingles = shingle_hashes(text, self.ngram)
        if shingles.size == 0:
            return None
        sig = np.full(self._a.shape, np.iinfo(np.uint64).max, dtype=np.uint64)
        with np.errstate(over="ignore"):
            for start in range(0, shingles.size, _CHUNK):
                x = shingles[start : start + _CHUNK, None]
                np.minimum(sig, ((x * self._a + self._b) >> np.uint64(32)).min(axis=0), out=sig)
        return sig.astype(np.uint32)

    def band_keys(self, signature: np.ndarray) -> list[int]:
        """One 64-bit bucket hash per band (documents share a bucket when a band agrees)."""
        rows = signature.reshape(self.bands, self.rows)
        return [int.from_bytes(hashlib.blake2b(r.tobytes(), digest_size=8).digest(), "little") for r in rows]
