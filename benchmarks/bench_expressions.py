"""Curation expressions (issue 39): the engine vs the record path vs Polars itself, and hash options.

One job on one generated corpus (`--docs` documents of 20-200 words of Latin, Greek, Cyrillic
and CJK text, 1% of them holding U+019B, which Polars upper-cases otherwise than Python):
`load_jsonl()` -> `with_columns(lower=str_lower, words=word_count,
h=hash, web=str_matches("^https?://[a-z0-9.]+/"))` -> `filter(is_in(lang) & words >= 20)` ->
`write_jsonl`. Each variant runs in its own fresh process on one core (the sync backend, one
shard): zephyr in the engine, zephyr on records (`ZEPHYR_COLUMNAR=0`; both must write the same
records), and Polars eager doing the same with its own functions (its lower-casing and `\\S+`
differ from Python's on rare characters; its xxhash64 of the same key bytes). Then the cost
per value of the stable hash options on the corpus's texts, and the CPU cost per row of each
function in Polars (as translated; for `str_lower`/`str_upper`, which stay in Python, Polars'
own `to_lowercase`/`to_uppercase`, and mapping ASCII rows in Polars and the rest in Python
inside the expression, the design measured and dropped) and in Python (the engine's fallback).

    uv run python benchmarks/bench_expressions.py --json benchmarks/results/expressions.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine

VOCAB = ["the", "data", "model", "été", "naïve", "—", "“quoted”", "Straße", "ΑΘΗΝΑ", "данные", "数据", "Tokyo", "x1", "FOO"]
RARE = "\u019b"  # ƛ: Polars maps its case otherwise than Python 3.11 (Unicode 16 vs 14)
PATTERN = "^https?://[a-z0-9.]+/"


def make_corpus(path: str, docs: int) -> None:
    rng = random.Random(0)
    with open(path, "w", encoding="utf-8") as f:
        for i in range(docs):
            words = rng.choices(VOCAB, k=rng.randint(20, 200))
            if rng.random() < 0.01:
                words.append(RARE)
            if rng.random() < 0.1:
                words = words[:10]
            url = rng.choice(["https://example.org/", "http://a.b.com/x", "ftp://c/", "https://EX.com/"]) + str(i)
            f.write(json.dumps({"id": i, "url": url, "lang": rng.choice(["en", "de", "fr", "zh", "ru"]), "text": " ".join(words)},
                               ensure_ascii=False) + "\n")


def run_zephyr(corpus: str, out: str) -> None:
    from zephyr import Dataset, col, create_backend

    ds = Dataset.from_files([corpus]).load_jsonl().with_columns(
        lower=col("text").str_lower(), words=col("text").word_count(), h=col("text").hash(), web=col("url").str_matches(PATTERN),
    ).filter(col("lang").is_in(["en", "de", "fr"]) & (col("words") >= 20))
    with tempfile.TemporaryDirectory() as scratch:
        backend = create_backend("sync", progress=False, scratch_dir=scratch)
        execution = backend.execute(ds.write_jsonl(os.path.join(out, "part-{shard:05d}.jsonl")))
        list(execution)
        print(json.dumps({"counters": {k: v for k, v in execution.counters.items() if "python" in k or "engine" in k}}))
        backend.close()


def run_polars(corpus: str, out: str) -> None:
    import polars as pl
    import polars_hash  # noqa: F401

    df = pl.read_ndjson(corpus)
    df = df.with_columns(
        lower=pl.col("text").str.to_lowercase(), words=pl.col("text").str.count_matches(r"\S+").cast(pl.Int64),
        h=pl.concat_str([pl.lit("s"), pl.col("text")]).nchash.xxhash64(), web=pl.col("url").str.contains(PATTERN),
    ).filter(pl.col("lang").is_in(["en", "de", "fr"]) & (pl.col("words") >= 20))
    os.makedirs(out, exist_ok=True)
    df.write_ndjson(os.path.join(out, "part-00000.jsonl"))


def hash_options(corpus: str) -> dict:
    """Seconds per value of each stable 64-bit hash of the texts' key bytes."""
    import hashlib

    import polars as pl
    import polars_hash  # noqa: F401
    import xxhash
    from zephyr.canonical import key_bytes

    texts = [json.loads(line)["text"] for line in open(corpus, encoding="utf-8")]
    series = pl.Series("t", texts)
    options = {
        "python: key_bytes + xxhash.xxh64_intdigest (record path)": lambda: [xxhash.xxh64_intdigest(key_bytes(t)) for t in texts],
        "python: key_bytes + blake2b(digest_size=8)": lambda: [hashlib.blake2b(key_bytes(t), digest_size=8).digest() for t in texts],
        "polars key bytes + xxhash per value (map_batches)": lambda: [
            xxhash.xxh64_intdigest(b) for b in pl.select(pl.concat_str([pl.lit("s"), series]).cast(pl.Binary)).to_series().to_list()],
        "polars key bytes + polars-hash xxhash64 (engine)": lambda: pl.select(pl.concat_str([pl.lit("s"), series]).nchash.xxhash64()),
        "polars hash() (not stable across versions)": lambda: series.hash(),
    }
    out = {}
    for name, fn in options.items():
        best = min(_timed(fn) for _ in range(3))
        out[name] = round(best / len(texts) * 1e9, 1)
    return out


def per_function(corpus: str) -> dict:
    """CPU ns per row of each function on the corpus's texts: in Polars as the engine translates
    it, and in Python as the engine's fallback runs it (evaluate each record, make a column)."""
    import polars as pl
    from zephyr import col
    from zephyr.engine.frame import typed_series
    from zephyr.engine.translate import to_polars

    records = [json.loads(line) for line in open(corpus, encoding="utf-8")]
    df = pl.DataFrame({"text": [r["text"] for r in records], "url": [r["url"] for r in records]})
    schema = dict(df.schema)
    functions = {"str_lower": col("text").str_lower(), "str_upper": col("text").str_upper(), "str_strip": col("text").str_strip(),
                 "word_count": col("text").word_count(), "str_contains": col("text").str_contains("model"),
                 "str_matches": col("url").str_matches(PATTERN), "hash": col("text").hash(), "str_len": col("text").str_len(),
                 "is_in": col("url").is_in(["https://example.org/1", "x"]), "cast": col("text").str_len().cast("str")}
    text = pl.col("text")
    ascii_only = text.str.len_bytes() == text.str.len_chars()
    split = pl.coalesce(pl.when(ascii_only).then(text).str.to_lowercase(), pl.when(~ascii_only).then(text).map_batches(
        lambda v: pl.Series([None if s is None else s.lower() for s in v.to_list()], dtype=pl.String), return_dtype=pl.String))
    own = {"str_lower": text.str.to_lowercase(), "str_upper": text.str.to_uppercase(), "str_lower split by ASCII": split}
    functions["str_lower split by ASCII"] = functions["str_lower"]
    out = {}
    for name, expr in functions.items():
        polars = own[name] if name in own else to_polars(expr, schema)[0]
        engine = min(_cpu(lambda: df.select(polars)) for _ in range(3))
        python = min(_cpu(lambda: typed_series("v", [expr.evaluate(r) for r in records])) for _ in range(3))
        out[name] = {"polars_ns": round(engine / len(records) * 1e9), "python_ns": round(python / len(records) * 1e9),
                     "ratio": round(python / engine, 2)}
    return out


def _cpu(fn) -> float:
    start = time.process_time()
    fn()
    return time.process_time() - start


def _timed(fn) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def child(variant: str, corpus: str, out: str) -> None:
    start, cpu = time.perf_counter(), time.process_time()
    if variant == "polars":
        run_polars(corpus, out)
    else:
        run_zephyr(corpus, out)
    print(json.dumps({"wall_s": round(time.perf_counter() - start, 3), "cpu_s": round(time.process_time() - cpu, 3),
                      "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)}))


def records_of(out: str) -> list:
    return [json.loads(line) for name in sorted(os.listdir(out)) if name.endswith(".jsonl")
            for line in open(os.path.join(out, name), encoding="utf-8")]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=200_000)
    parser.add_argument("--json", help="write the results here too")
    parser.add_argument("--child", nargs=3, help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        return child(*args.child)
    with tempfile.TemporaryDirectory(prefix="bench-expr-") as work:
        corpus = os.path.join(work, "corpus.jsonl")
        make_corpus(corpus, args.docs)
        results = {"machine": machine(), "load_before": load_average(), "docs": args.docs, "corpus_mb": round(os.path.getsize(corpus) / 1e6, 1)}
        for variant, columnar in (("zephyr-engine", "1"), ("zephyr-records", "0"), ("polars", "1")):
            out = os.path.join(work, variant)
            env = {**os.environ, "ZEPHYR_COLUMNAR": columnar}
            done = subprocess.run([sys.executable, __file__, "--child", variant, corpus, out], env=env, capture_output=True, text=True, check=True)
            lines = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
            results[variant] = {k: v for line in lines for k, v in line.items()}
            results[variant]["rows_out"] = len(records_of(out))
        engine, records = records_of(os.path.join(work, "zephyr-engine")), records_of(os.path.join(work, "zephyr-records"))
        results["engine_equals_records"] = engine == records
        results["hash_ns_per_value"] = hash_options(corpus)
        results["per_function"] = per_function(corpus)
        results["load_after"] = load_average()
    print(json.dumps(results, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(results, f, indent=2)


if __name__ == "__main__":
    main()
