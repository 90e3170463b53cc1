"""Where the fuzzy dedup's signature stage spends its CPU, and what Arrow batches could take off it (issue 26).

One core, one process, on bench_fuzzy_dedup.py's corpus (300-word documents of ~1.3 KB): the
time per document of each piece of the signature stage (`zephyr.dedup.fuzzy.Signatures`) on
records, and of the same pieces on Arrow: parsing the lines with pyarrow instead of orjson,
and word 5-gram shingles made with pyarrow.compute (lower-case, split on whitespace, join
five shifted word columns) instead of Python's `str` methods. The Arrow shingles are checked
to give the same signatures.

    uv run python benchmarks/bench_signature_batches.py --originals 10000
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_fuzzy_dedup import make_corpus
from machine import load_average, machine

from zephyr.dedup import components as cc
from zephyr.dedup.minhash import MinHasher, shingles


def arrow_shingles(texts: pa.Array, ngram: int) -> pa.Array:
    """Each text's word n-grams (as `minhash.shingles` makes them) as a list<large_string> array,
    made with pyarrow.compute (documents of at least `ngram` words only)."""
    words = pc.utf8_split_whitespace(pc.utf8_lower(texts.cast(pa.large_string())))
    flat = pc.list_flatten(words)
    offsets = words.offsets.to_numpy()
    starts_ok = len(flat) - ngram + 1
    grams = pc.binary_join_element_wise(*[flat.slice(j, starts_ok) for j in range(ngram)], pa.scalar(" ", pa.large_string()))
    per_doc = np.maximum(np.diff(offsets) - ngram + 1, 0)
    first = np.cumsum(per_doc) - per_doc
    starts = np.repeat(offsets[:-1], per_doc) + (np.arange(per_doc.sum()) - np.repeat(first, per_doc))
    list_offsets = np.zeros(len(texts) + 1, dtype=np.int64)
    list_offsets[1:] = np.cumsum(per_doc)
    return pa.LargeListArray.from_arrays(pa.array(list_offsets), grams.take(pa.array(starts)))


def timed(f) -> tuple[float, object]:
    start = time.process_time()
    result = f()
    return time.process_time() - start, result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--originals", type=int, default=10000, help="bench_fuzzy_dedup.py's --originals (default 10,000: 20,000 docs)")
    parser.add_argument("--json", default=None)
    args = parser.parse_args()
    docs = [d for shard in make_corpus(args.originals, 1) for d in shard]
    data = b"".join(orjson.dumps(d) + b"\n" for d in docs)
    lines = data.splitlines()
    n = len(lines)
    hasher = MinHasher(5, 20, 11, 0)
    rows = {}

    def measure(name: str, f):
        seconds, result = timed(f)
        rows[name] = round(seconds / n * 1e6, 2)
        return result

    records = measure("parse: orjson per line (records)", lambda: [orjson.loads(line) for line in lines])
    table = measure("parse: pyarrow.json (batches)", lambda: pj.read_json(
        pa.BufferReader(data), read_options=pj.ReadOptions(use_threads=False, block_size=len(data) + 1)))
    texts = [r["text"] for r in records]
    grams = measure("shingles: Python str methods (records)", lambda: [shingles(t, hasher.ngram) for t in texts])
    arrow_grams = measure("shingles: pyarrow.compute (batches)", lambda: arrow_shingles(table.column("text").combine_chunks(), hasher.ngram))
    arrow_lists = measure("shingles: pyarrow.compute, to Python lists for rensa", lambda: arrow_grams.to_pylist())
    assert arrow_lists == grams, "the Arrow shingles differ from minhash.shingles"

    def minhash(all_grams):
        import rensa

        out = []
        for g in all_grams:
            h = rensa.RMinHash(num_perm=hasher.bands * hasher.rows, seed=hasher.seed)
            h.update(g)
            out.append(np.asarray(h.digest(), dtype=np.uint32))
        return out

    signatures = measure("MinHash: rensa on the shingles", lambda: minhash(grams))
    measure("band keys: NumPy", lambda: hasher.band_key_matrix(np.stack(signatures)))
    measure("blocks: pickle + zstd of the records", lambda: [cc.docs_block(0, i, records[i : i + cc.BLOCK]) for i in range(0, n, cc.BLOCK)])
    out = {"benchmark": "signature_batches", "machine": machine(), "load": load_average(), "docs": n,
           "mb": round(len(data) / 1e6, 1), "us_per_doc": rows}
    print(f"{n:,} docs, {len(data) / 1e6:.1f} MB of JSON lines, one core; load {out['load']}")
    print("| piece | µs/doc |\n|---|---|")
    for name, us in rows.items():
        print(f"| {name} | {us} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
