"""Zephyr's Ray backend vs a hand-written multiprocessing.Pool loop, and per-shard overhead.

Part 1, throughput: the same CPU-bound per-document job over every shard of a synthetic
JSONL.zst corpus (decode, NFKC-normalize, lowercase, tokenize into words, compute quality
signals, filter, encode, zstd level 3, atomic write), run by
  - zephyr: `Dataset.from_files(...).load_jsonl().map(annotate).filter(keep).write_jsonl(...)`
    on `create_backend("ray")` over a local Ray with `--cores` CPUs, already warm (one
    untimed run first, so workers exist and have imported everything), and
  - a baseline: `multiprocessing.Pool(--cores)` (created before timing) mapping a plain
    function over the files that does the same per-document work with zstandard + orjson.
Ray starts its workers at niceness 15; the Pool's workers get the same niceness
(`--pool-niceness`) so that other work on a shared machine slows both alike. The two alternate
for `--repeats` rounds; medians and best runs are reported and the outputs are checked to hold
the same records.

Part 2, overhead: `--tiny-shards` shards of one item each through a no-op map, on the warm Ray
and on the threadpool backend, reported in ms per shard; plus bare Ray tasks (`ray.remote` of
a no-op, same in-flight bound) to separate Ray's own cost from zephyr's.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python benchmarks/bench_ray_backend.py --json out.json
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import multiprocessing
import os
import re
import shutil
import statistics
import sys
import time
import unicodedata
from collections import Counter

# Ray workers started under `uv run` would re-enter `uv run` (+3 s each); the venv is synced.
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

import orjson
import zstandard

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, start_local_ray, work_dir  # noqa: E402
from corpus import ensure_corpus

# ---- the per-document work, shared verbatim by both runners --------------------------------

_WORD = re.compile(r"\w+")
MIN_WORDS = 50
MAX_TOP_WORD_FRACTION = 0.2


def annotate(doc: dict) -> dict:
    """Normalize the text and attach quality signals (CPU-bound pure Python + C helpers)."""
    text = unicodedata.normalize("NFKC", doc["text"])
    lowered = text.lower()
    words = _WORD.findall(lowered)
    counts = Counter(words)
    n = len(words)
    top = counts.most_common(1)[0][1] if counts else 0
    sentences = max(1, lowered.count("."))
    return {
        "id": doc["id"],
        "url": doc["url"],
        "text": " ".join(text.split()),
        "num_words": n,
        "num_unique_words": len(counts),
        "top_word_fraction": top / n if n else 1.0,
        "mean_sentence_words": n / sentences,
        "text_hash": hashlib.blake2b(lowered.encode(), digest_size=8).hexdigest(),
    }


def keep(doc: dict) -> bool:
    return doc["num_words"] >= MIN_WORDS and doc["top_word_fraction"] <= MAX_TOP_WORD_FRACTION


def noop(item):
    return item


# ---- the hand-written baseline ---------------------------------------------------------------


def baseline_process_file(args: tuple[str, str]) -> int:
    """Read one JSONL.zst, annotate + filter every doc, write JSONL.zst (level 3) atomically."""
    src, dst = args
    compressor = zstandard.ZstdCompressor(level=3).compressobj()
    written = 0
    tmp = f"{dst}.tmp-{os.getpid()}"
    with open(src, "rb") as raw, open(tmp, "wb") as out:
        reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=1 << 20)
        batch: list[bytes] = []
        size = 0
        for line in reader:
            doc = annotate(orjson.loads(line))
            if not keep(doc):
                continue
            encoded = orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE)
            batch.append(encoded)
            size += len(encoded)
            written += 1
            if size >= 1 << 20:
                out.write(compressor.compress(b"".join(batch)))
                batch, size = [], 0
        out.write(compressor.compress(b"".join(batch)))
        out.write(compressor.flush())
    os.replace(tmp, dst)
    return written


def run_baseline(pool, paths: list[str], out_dir: str) -> float:
    _fresh(out_dir)
    jobs = [(p, os.path.join(out_dir, f"part-{i:05d}.jsonl.zst")) for i, p in enumerate(paths)]
    start = time.perf_counter()
    pool.map(baseline_process_file, jobs, chunksize=1)
    return time.perf_counter() - start


# ---- zephyr ------------------------------------------------------------------------------------


def w1_corpus(directory: str, shards: int, docs_per_shard: int):
    """W1's input (also bench_status.py's): documents of 200-2,000 characters, no duplicates."""
    return ensure_corpus(directory, num_shards=shards, docs_per_shard=docs_per_shard, dup_fraction=0.0,
                         min_chars=200, max_chars=2000, seed=3)


def run_zephyr(backend, paths: list[str], out_dir: str) -> float:
    from zephyr import Dataset

    _fresh(out_dir)
    pipeline = (
        Dataset.from_files(list(paths)).load_jsonl().map(annotate).filter(keep)
        .write_jsonl(os.path.join(out_dir, "part-{shard:05d}.jsonl.zst"))
    )
    start = time.perf_counter()
    list(backend.execute(pipeline))
    return time.perf_counter() - start


def run_tiny(backend, num_shards: int) -> float:
    from zephyr import Dataset

    pipeline = Dataset.from_list(list(range(num_shards))).map(noop)
    start = time.perf_counter()
    results = list(backend.execute(pipeline))
    elapsed = time.perf_counter() - start
    if results != list(range(num_shards)):
        raise RuntimeError("tiny-shard run returned the wrong items")
    return elapsed


def run_bare_ray(num_tasks: int, window: int) -> float:
    """`num_tasks` no-op Ray tasks with at most `window` in flight (zephyr's default bound)."""
    import ray

    remote = ray.remote(num_cpus=1)(noop)
    start = time.perf_counter()
    in_flight: list = []
    submitted = 0
    while submitted < num_tasks or in_flight:
        while submitted < num_tasks and len(in_flight) < window:
            in_flight.append(remote.remote(submitted))
            submitted += 1
        done, in_flight = ray.wait(in_flight, num_returns=1)
        ray.get(done)
    return time.perf_counter() - start


# ---- helpers -------------------------------------------------------------------------------------


def _fresh(directory: str) -> None:
    shutil.rmtree(directory, ignore_errors=True)
    os.makedirs(directory)


def _output_digest(out_dir: str) -> tuple[int, str]:
    """(records, digest) of the decompressed outputs in file order: equal for equal content."""
    h = hashlib.blake2b(digest_size=16)
    records = 0
    for name in sorted(os.listdir(out_dir)):
        if not name.endswith(".jsonl.zst"):
            continue
        with open(os.path.join(out_dir, name), "rb") as raw:
            data = zstandard.ZstdDecompressor().stream_reader(raw).read()
        records += data.count(b"\n")
        h.update(data)
    return records, h.hexdigest()


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="example: uv run python benchmarks/bench_ray_backend.py --shards 16 --docs-per-shard 8000 --json ray.json",
    )
    parser.add_argument("--shards", type=int, default=16, help="input shards (default 16)")
    parser.add_argument("--docs-per-shard", type=int, default=8000, help="documents per shard (default 8000, ~1.1 KB of text each)")
    parser.add_argument("--cores", type=int, default=2, help="Ray num_cpus and Pool processes (default 2)")
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds of each runner, alternating (default 5)")
    parser.add_argument("--pool-niceness", type=int, default=15,
                        help="niceness increment of the Pool's workers (default 15, what Ray gives its workers; 0: default priority)")
    parser.add_argument("--tiny-shards", type=int, default=2000, help="no-op shards for the overhead test (default 2000; 0 skips it)")
    parser.add_argument("--work-dir", default=None, help="where the corpus and outputs go (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    for name in ("shards", "docs_per_shard", "cores", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.tiny_shards < 0:
        parser.error(f"--tiny-shards must be >= 0, got {args.tiny_shards}")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with work_dir(args.work_dir, "zephyr-bench-ray-") as work:
        return _bench(args, work)


def _bench(args: argparse.Namespace, work: str) -> dict:
    import ray
    from zephyr import create_backend

    load_before = load_average()
    info = w1_corpus(os.path.join(work, "corpus"), args.shards, args.docs_per_shard)
    paths = list(info.paths)
    mb = info.bytes_uncompressed / 1e6

    # fork the Pool's workers before Ray starts its threads (and installs its signal handlers);
    # Ray runs its workers at niceness 15: the Pool's get the same, so other load slows both alike
    pool = multiprocessing.get_context("fork").Pool(args.cores, initializer=os.nice, initargs=(args.pool_niceness,))
    t0 = time.perf_counter()
    start_local_ray(args.cores)
    ray_start = time.perf_counter() - t0
    backend = create_backend("ray", progress=False)
    try:
        # warm-up (untimed): Ray workers start and import zephyr/orjson/zstandard; Pool workers fork
        warm_ray = run_zephyr(backend, paths, os.path.join(work, "out-ray"))
        run_baseline(pool, paths, os.path.join(work, "out-mp"))
        times: dict[str, list[float]] = {"ray": [], "mp": []}
        loads: list[float] = []
        for _ in range(args.repeats):
            loads.append(round(os.getloadavg()[0], 2))
            times["mp"].append(run_baseline(pool, paths, os.path.join(work, "out-mp")))
            times["ray"].append(run_zephyr(backend, paths, os.path.join(work, "out-ray")))
        same = _output_digest(os.path.join(work, "out-ray")) == _output_digest(os.path.join(work, "out-mp"))
        kept = _output_digest(os.path.join(work, "out-mp"))[0]
        if not same:
            raise RuntimeError("zephyr and the baseline wrote different records")

        overhead = {}
        if args.tiny_shards:
            run_tiny(backend, min(args.tiny_shards, 200))  # warm
            overhead["ray"] = run_tiny(backend, args.tiny_shards)
            overhead["bare_ray_tasks"] = run_bare_ray(args.tiny_shards, backend.max_parallelism)
            threads = create_backend("threadpool", max_parallelism=args.cores, progress=False)
            try:
                run_tiny(threads, min(args.tiny_shards, 200))
                overhead["threadpool"] = run_tiny(threads, args.tiny_shards)
            finally:
                threads.close()
    finally:
        pool.close()
        pool.join()
        backend.close()
        ray.shutdown()

    med = {k: statistics.median(v) for k, v in times.items()}
    best = {k: min(v) for k, v in times.items()}
    result = {
        "benchmark": "ray_backend",
        "machine": machine(),
        "load_avg_before": load_before,
        "load_avg_after": load_average(),
        "params": vars(args) | {"docs": info.num_docs, "input_mb": round(mb, 1), "kept_docs": kept},
        "ray_init_s": round(ray_start, 2),
        "ray_warmup_run_s": round(warm_ray, 2),
        "throughput": {
            name: {"runs_s": [round(t, 2) for t in ts], "median_s": round(med[name], 2), "best_s": round(best[name], 2),
                   "docs_per_s": round(info.num_docs / med[name]), "docs_per_s_best": round(info.num_docs / best[name]),
                   "mb_per_s": round(mb / med[name], 1)}
            for name, ts in times.items()
        },
        "ray_vs_mp": round(med["mp"] / med["ray"], 3),
        "ray_vs_mp_best": round(best["mp"] / best["ray"], 3),
        "load_avg_1min_per_round": loads,
        "outputs_identical": same,
        "overhead_ms_per_shard": {k: round(v / args.tiny_shards * 1000, 3) for k, v in overhead.items()},
    }
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def print_table(r: dict) -> None:
    p, m = r["params"], r["machine"]
    print(f"\nRay backend vs multiprocessing.Pool: {p['shards']} shards x {p['docs_per_shard']:,} docs "
          f"= {p['docs']:,} docs, {p['input_mb']} MB JSONL in, {p['kept_docs']:,} docs out; {p['cores']} cores; "
          f"Pool workers at niceness +{p['pool_niceness']} (Ray's workers run at 15)")
    print(f"machine: {m['cores']} cores, {m['ram_gib']} GiB, Python {m['python']}, Ray {m['ray']}; "
          f"load avg before {r['load_avg_before']}, after {r['load_avg_after']}")
    print(f"ray.init {r['ray_init_s']} s; first (warm-up) zephyr run {r['ray_warmup_run_s']} s")
    print()
    print("| runner | runs (s) | median (s) | best (s) | docs/s (median) | docs/s (best) | MB/s in (median) |")
    print("|---|---|---|---|---|---|---|")
    labels = {"mp": "multiprocessing.Pool", "ray": "zephyr on Ray (warm)"}
    for name in ("mp", "ray"):
        t = r["throughput"][name]
        print(f"| {labels[name]} | {', '.join(f'{x:.2f}' for x in t['runs_s'])} | {t['median_s']:.2f} | {t['best_s']:.2f} | "
              f"{t['docs_per_s']:,} | {t['docs_per_s_best']:,} | {t['mb_per_s']} |")
    print(f"\nRay / multiprocessing throughput ratio: {r['ray_vs_mp']:.2f}x on medians, {r['ray_vs_mp_best']:.2f}x on best runs "
          f"(target >= 0.8x); outputs identical: {r['outputs_identical']}")
    print(f"1-minute load average at the start of each round: {', '.join(str(x) for x in r['load_avg_1min_per_round'])}")
    if r["overhead_ms_per_shard"]:
        print(f"\nPer-shard overhead, {p['tiny_shards']:,} one-item shards through a no-op map:")
        print()
        print("| runner | ms per shard |")
        print("|---|---|")
        labels = {"ray": "zephyr on Ray (warm)", "bare_ray_tasks": "bare Ray tasks (same window)",
                  "threadpool": f"zephyr threadpool ({p['cores']} threads)"}
        for name, ms in r["overhead_ms_per_shard"].items():
            print(f"| {labels[name]} | {ms:.3f} |")


if __name__ == "__main__":
    main()
