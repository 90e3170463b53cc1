"""CPU seconds to hash shuffle keys, candidates side by side (issue 39, section 27 of README.md).

Each candidate turns 2M canonical key encodings (`b"s"` + text, as a `col("text")` key gives)
into uint64 hashes, from the two forms the shuffle holds them in: Python `bytes` (the record
path) and a Polars Binary column (the frame path). Best of `--repeats`, alternated:

    uv run --group bench python benchmarks/bench_key_hash.py --keys 2000000
"""

from __future__ import annotations

import argparse
import time
import zlib

import numpy as np
import polars as pl
import polars_hash  # noqa: F401
import pyarrow as pa
import xxhash

from zephyr.shuffle.keys import SEED, hash_key_bytes, hash_keys, key_column_of, splitmix64


def crc_splitmix(kbs: list[bytes]) -> np.ndarray:
    """The hash before section 27: CRC-32 per key (and its length) through splitmix64."""
    crc = np.fromiter(map(zlib.crc32, kbs), dtype=np.uint64, count=len(kbs))
    lengths = np.fromiter(map(len, kbs), dtype=np.uint64, count=len(kbs))
    return splitmix64(crc | (lengths << np.uint64(32)))


def xxh3(kb: pl.Series) -> np.ndarray:
    return kb.to_frame("kb").select(pl.col("kb").nchash.xxh3_64(seed=SEED)).to_series().to_numpy()


def keys_of(n: int, low: int, high: int) -> list[bytes]:
    rng = np.random.default_rng(4)
    lengths = rng.integers(low, high, n)
    blob = rng.integers(97, 123, int(lengths.sum()), dtype=np.uint8).tobytes()
    ends = np.cumsum(lengths).tolist()
    return [b"s" + blob[end - length : end] for end, length in zip(ends, lengths.tolist())]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--keys", type=int, default=2_000_000)
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args()
    for label, (low, high) in {"texts of 50-400 chars": (50, 400), "short keys, 8-40 chars": (8, 40)}.items():
        kbs = keys_of(args.keys, low, high)
        column = pl.Series(kbs, dtype=pl.Binary)
        candidates = {
            "record path: CRC-32 per key + splitmix64 (before)": lambda: crc_splitmix(kbs),
            "record path: xxhash.xxh64_intdigest per key": lambda: np.fromiter(
                (xxhash.xxh64_intdigest(k, seed=SEED) for k in kbs), dtype=np.uint64, count=len(kbs)),
            "record path: Binary column + polars-hash xxhash64 (after)": lambda: hash_key_bytes(kbs),
            "record path, Arrow key column: pa.array + CRC-32 per key (before)": lambda: (
                pa.array(kbs, pa.large_binary()), crc_splitmix(kbs)),
            "record path, Arrow key column: Binary column + xxhash64 + to Arrow (after)": lambda: key_column_of(
                pl.Series(kbs, dtype=pl.Binary)),
            "frame path: CRC-32 per key + splitmix64 (before; to_list)": lambda: crc_splitmix(column.to_list()),
            "frame path: polars-hash xxhash64 (after)": lambda: hash_keys(column),
            "frame path: polars-hash xxh3_64": lambda: xxh3(column),
        }
        best = dict.fromkeys(candidates, float("inf"))
        for _ in range(args.repeats):
            for name, run in candidates.items():
                start = time.process_time()
                run()
                best[name] = min(best[name], time.process_time() - start)
        print(f"{args.keys:,} keys, {label}:")
        for name, seconds in best.items():
            print(f"| {name} | {seconds:.3f} |")


if __name__ == "__main__":
    main()
