"""Daft's near-duplicate removal for benchmarks/bench_fuzzy_dedup.py, run in its own environment:

    uv run --isolated --no-project --with daft==0.7.26 python benchmarks/daft_fuzzy.py IN_DIR OUT_DIR CORES

(daft 0.7.26 pins pyarrow < 26, below the project's, so it cannot join the `bench` group.)
Daft has a `minhash` expression (word n-grams of whitespace-split text, murmurhash3) but no
connected components, so the job is written with its DataFrame API: signatures (220 hashes,
5-grams, lower-cased text), 20 band keys of 11 values each (`hash` of a list slice),
`unpivot`, the smallest document of each bucket (`groupby`/`min`), edges to it (`join`), then
min-label propagation over the edges, one `join` + `groupby` per iteration, collected each
time to test for convergence (a driver loop: Daft has no iteration), and a last join that keeps
each document without a smaller label. Documents are ordered by their `n` field (input shard,
position), so the kept one of a cluster is the first, as in zephyr. Prints one JSON line.
"""

import json
import sys
import time

import daft
import daft.functions as F
from daft import col

BANDS, ROWS = 20, 11


def main(in_dir: str, out_dir: str, cores: int) -> dict:
    daft.set_runner_native(num_threads=cores)
    start = time.perf_counter()
    docs = daft.read_json(f"{in_dir}/*.jsonl")
    sig = docs.select("n", F.minhash(col("text").lower(), num_hashes=BANDS * ROWS, ngram_size=5, seed=0).alias("sig"))
    keys = sig.select("n", *[F.hash(F.slice(col("sig"), b * ROWS, (b + 1) * ROWS), seed=b).alias(f"b{b}") for b in range(BANDS)])
    keys = keys.unpivot("n", [f"b{b}" for b in range(BANDS)], variable_name="band", value_name="key").collect()
    roots = keys.groupby("band", "key").agg(col("n").min().alias("root"))
    edges = keys.join(roots, on=["band", "key"]).where(col("root") != col("n")).select(col("root").alias("u"), col("n").alias("v"))
    edges = edges.distinct().collect()
    t_candidates = time.perf_counter() - start
    both = edges.concat(edges.select(col("v").alias("u"), col("u").alias("v"))).collect()
    labels = both.groupby("u").agg(col("u").min().alias("label"))  # each node starts as its own label
    iterations = 0
    while True:
        iterations += 1
        proposed = both.join(labels.select(col("u").alias("v"), col("label").alias("nl")), on="v").groupby("u").agg(col("nl").min().alias("m"))
        smaller = col("m").not_null() & (col("m") < col("label"))
        merged = labels.join(proposed, on="u", how="left").select("u", "label", F.when(smaller, col("m")).otherwise(col("label")).alias("new")).collect()
        changed = merged.where(col("new") != col("label")).count_rows()
        labels = merged.select("u", col("new").alias("label")).collect()
        if changed == 0:
            break
    dropped = labels.where(col("label") != col("u")).select(col("u").alias("n"), col("label"))
    kept = docs.join(dropped, on="n", how="anti")
    kept.write_json(out_dir)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "candidates_s": round(t_candidates, 2), "iterations": iterations,
            "edges": edges.count_rows(), "removed": dropped.count_rows()}


if __name__ == "__main__":
    print(json.dumps(main(sys.argv[1], sys.argv[2], int(sys.argv[3]))))
