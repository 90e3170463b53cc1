"""MinHash signatures of word n-gram shingles, and their LSH band keys.

A document's shingles are its runs of `ngram` consecutive lower-cased, whitespace-split words
joined by one space (a text shorter than that is one shingle). Signatures come from `rensa`
(Rust MinHash, seeded: the same values in every process and platform; measured 7x faster than
NumPy vectorised and 6x faster than datasketch, benchmarks/README.md section 10). Two documents
agree in one signature position with probability equal to the Jaccard similarity of their
shingle sets, so a band of `rows` positions agrees with probability s**rows, and at least one
of `bands` bands with 1 - (1 - s**rows)**bands (the S-curve; see docs/zephyr.md). A band key
is a 64-bit hash of the band's index and values (splitmix64 steps in NumPy, a block of
signatures at a time), the same in every process, never Python's salted `hash`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from zephyr.shuffle.keys import splitmix64

__all__ = ["MinHasher", "choose_bands", "collision_probability", "shingles"]

_GOLDEN = np.uint64(0x9E3779B97F4A7C15)


def shingles(text: str, ngram: int) -> list[str]:
    """`text`'s word `ngram`-grams, lower-cased, in order (empty for a text without words)."""
    words = text.lower().split()
    n = min(ngram, len(words))
    return list(map(" ".join, zip(*[words[k:] for k in range(n)]))) if words else []  # 1.3x a slicing loop


def collision_probability(similarity: float, bands: int, rows: int) -> float:
    """Probability that two documents of Jaccard `similarity` share at least one LSH bucket."""
    return 1.0 - (1.0 - similarity**rows) ** bands


def choose_bands(threshold: float, num_perms: int) -> tuple[int, int]:
    """(bands, rows) for `threshold`, with `low` = max(threshold - 0.3, threshold / 2). Of the
    splits of `num_perms` into bands x (num_perms // bands) rows, exact ones first, those that
    find a pair at `threshold + 0.1` (capped at 0.99) with probability >= 0.999 and one at
    `threshold` with >= 0.75, and merge a pair at `low` with <= 0.05: the one that merges at
    `low` least often. With 0.8 and 220: 20 bands of 11 rows (0.9 -> 0.9995, 0.8 -> 0.83,
    0.7 -> 0.33, 0.5 -> 0.0097).

    Below a threshold of about 0.7 no split of 220 does all that (too few permutations to
    tell `low` from `threshold` so sharply); then it is the bands x rows within `num_perms`
    whose worse error, max(P(low), 1 - P(threshold)), is least: 0.3 -> 61x3 (0.15 -> 0.19,
    0.3 -> 0.81). At 0.1 and below even that errs by more than 0.3."""
    high, low = min(threshold + 0.1, 0.99), max(threshold - 0.3, threshold / 2)
    splits = [(b, num_perms // b) for b in range(1, num_perms + 1)]
    exact = [(b, r) for b, r in splits if b * r == num_perms]  # splits that use every permutation first

    def sharp(candidates: list[tuple[int, int]]) -> list[tuple[int, int]]:
        return [br for br in candidates if collision_probability(high, *br) >= 0.999
                and collision_probability(threshold, *br) >= 0.75 and collision_probability(low, *br) <= 0.05]

    targeted = sharp(exact) or sharp(splits)
    if targeted:
        return min(targeted, key=lambda br: (collision_probability(low, *br), br[0]))
    every = [(b, r) for r in range(1, num_perms + 1) for b in range(1, num_perms // r + 1)]
    return min(every, key=lambda br: (_worse_error(threshold, low, *br), br[0]))


def _worse_error(threshold: float, low: float, bands: int, rows: int) -> float:
    """The larger of merging a pair at `low` and missing one at `threshold`."""
    return max(collision_probability(low, bands, rows), 1.0 - collision_probability(threshold, bands, rows))


@dataclass(frozen=True)
class MinHasher:
    """Signatures and band keys for one configuration; picklable, identical in every process."""

    ngram: int
    bands: int
    rows: int
    seed: int = 0

    def signature(self, text: str) -> np.ndarray | None:
        """The uint32 MinHash signature (bands*rows values), or None for a text without words."""
        import rensa

        grams = shingles(text, self.ngram)
        if not grams:
            return None
        h = rensa.RMinHash(num_perm=self.bands * self.rows, seed=self.seed)
        try:
            h.update(grams)  # rensa takes str as UTF-8: ~10x faster than a list of bytes
        except UnicodeEncodeError:  # a lone surrogate (text decoded with errors="surrogateescape")
            h = rensa.RMinHash(num_perm=self.bands * self.rows, seed=self.seed)
            h.update([g.encode("utf-8", "surrogatepass") for g in grams])  # valid text: the same bytes as the str
        return np.asarray(h.digest(), dtype=np.uint32)

    def band_keys(self, signature: np.ndarray) -> list[int]:
        """One 64-bit bucket key per band (documents share a bucket when a band agrees)."""
        return self.band_key_matrix(signature[None, :])[0].tolist()

    def band_key_matrix(self, signatures: np.ndarray) -> np.ndarray:
        """Bucket keys (uint64, one row per signature, one column per band) of stacked
        signatures; keys of different bands differ (the band index is hashed in)."""
        values = signatures.reshape(len(signatures), self.bands, self.rows).astype(np.uint64)
        h = np.broadcast_to((np.arange(self.bands, dtype=np.uint64) + np.uint64(1)) * _GOLDEN, values.shape[:2])
        for r in range(self.rows):
            h = splitmix64(h ^ values[:, :, r])
        return h

