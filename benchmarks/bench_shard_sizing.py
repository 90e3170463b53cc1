"""Shards sized by bytes: 100,000 small files and one large file, one shard per file vs `approx_shard_bytes`.

The input is one directory of JSON Lines: `--small-files` files of about 1.5 KB (ten documents
each) and one file of `--big-gb` GB (the issue's 10 GB-class file, scaled to this machine).
The pipeline reads every document and counts documents and characters in each shard
(`load_jsonl().map_shard(...)`): the work a filter does per record, without writing. Each
configuration runs in a fresh process on the threadpool backend with `--workers` workers:

- `one shard per file` (no `approx_shard_bytes`): one task per small file, and the large file
  in one task that every other finishes long before;
- `approx_shard_bytes=N`: the small files packed into shards of up to N bytes, the large one
  cut into spans of about N bytes on line boundaries.

Reported per configuration: tasks, planning time and the driver's memory for the plan (RSS
growth while planning), the run's wall time, CPU seconds and peak RSS (the driver runs the
threadpool's tasks too), the longest and the median task (seconds inside the task), and the
documents counted against the number the generator wrote.

    uv run python benchmarks/bench_shard_sizing.py --work-dir /tmp/sizing --json benchmarks/results/shard_sizing.json
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, work_dir  # noqa: E402

_DOCS_PER_SMALL = 10
_WORDS = ("data", "model", "token", "shard", "file", "byte", "line", "record", "crawl", "page", "text", "corpus")


def _doc(i: int) -> str:
    words = " ".join(_WORDS[(i * 7 + k * 3) % len(_WORDS)] for k in range(20 + i % 17))
    return json.dumps({"id": i, "url": f"https://example.com/{i}", "text": words}) + "\n"


def _generate(root: str, small_files: int, big_gb: float) -> dict:
    """The corpus (reused when its manifest matches): small files and one big file."""
    manifest = os.path.join(root, "corpus.json")
    wanted = {"small_files": small_files, "big_gb": big_gb}
    if os.path.exists(manifest):
        with open(manifest) as f:
            known = json.load(f)
        if {k: known.get(k) for k in wanted} == wanted:
            return known
    data = os.path.join(root, "in")
    os.makedirs(data, exist_ok=True)
    doc = 0
    for k in range(small_files):
        with open(os.path.join(data, f"small-{k:06d}.jsonl"), "w") as f:
            f.write("".join(_doc(doc + j) for j in range(_DOCS_PER_SMALL)))
        doc += _DOCS_PER_SMALL
    small_docs = doc
    target = int(big_gb * 1e9)
    written = 0
    with open(os.path.join(data, "big.jsonl"), "w") as f:  # sorts before "small-": the first shard
        while written < target:
            block = "".join(_doc(doc + j) for j in range(10_000))
            f.write(block)
            written += len(block)
            doc += 10_000
    known = {**wanted, "docs": doc, "small_docs": small_docs, "big_bytes": written}
    with open(manifest, "w") as f:
        json.dump(known, f)
    return known


def _count(records):
    """One shard's work: count documents and characters, and time it inside the task."""
    start = time.perf_counter()
    docs = chars = 0
    for record in records:
        docs += 1
        chars += len(record["text"])
    yield {"docs": docs, "chars": chars, "seconds": time.perf_counter() - start}


def _rss_mib(field: str) -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def child(root: str, approx: int | None, workers: int) -> dict:
    from zephyr import Dataset, create_backend

    before = _rss_mib("VmRSS")
    t0 = time.perf_counter()
    ds = Dataset.from_files(os.path.join(root, "in", "*.jsonl")).load_jsonl(approx_shard_bytes=approx).map_shard(_count)
    plan = ds.plan()
    t1 = time.perf_counter()
    planned = _rss_mib("VmRSS")
    backend = create_backend("threadpool", max_parallelism=workers, progress=False)
    try:
        results = list(backend.execute(ds))
    finally:
        backend.close()
    t2 = time.perf_counter()
    usage = resource.getrusage(resource.RUSAGE_SELF)
    seconds = [r["seconds"] for r in results]
    return {"approx_shard_bytes": approx, "tasks": plan.num_shards, "plan_s": round(t1 - t0, 2),
            "plan_rss_mib": round(planned - before, 1), "run_s": round(t2 - t1, 1), "cpu_s": round(usage.ru_utime + usage.ru_stime, 1),
            "peak_rss_mib": round(_rss_mib("VmHWM"), 1), "longest_task_s": round(max(seconds), 2),
            "median_task_s": round(statistics.median(seconds), 4), "docs": sum(r["docs"] for r in results),
            "describe": plan.stages[0].input_label}


def _run(root: str, approx: int | None, workers: int) -> dict:
    command = [sys.executable, os.path.abspath(__file__), "--child", root, "--workers", str(workers), "--approx", str(approx or 0)]
    proc = subprocess.run(command, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"run {approx} failed:\n{proc.stderr[-3000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[7:])


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: uv run python benchmarks/bench_shard_sizing.py --small-files 1000 --big-gb 0.05")
    parser.add_argument("--small-files", type=int, default=100_000, help="small files of ~1.5 KB (default 100,000)")
    parser.add_argument("--big-gb", type=float, default=2.0, help="size of the one large file in GB (default 2)")
    parser.add_argument("--approx", type=int, default=64 << 20, help="approx_shard_bytes of the sized run (default 64 MiB; 0: none)")
    parser.add_argument("--workers", type=int, default=2, help="threadpool workers (default 2: this machine's cores)")
    parser.add_argument("--work-dir", default=None, help="keep the corpus here (reused by a later run)")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.child, args.approx or None, args.workers)), flush=True)
        return
    with work_dir(args.work_dir, "zephyr-sizing-") as root:
        t0 = time.perf_counter()
        corpus = _generate(root, args.small_files, args.big_gb)
        generated = time.perf_counter() - t0
        load_before = load_average()
        rows = [_run(root, None, args.workers), _run(root, args.approx, args.workers)]
        load_after = load_average()
    for row in rows:
        assert row["docs"] == corpus["docs"], (row, corpus)  # every document read once
    result = {"benchmark": "shard_sizing", "machine": machine(), "corpus": corpus, "generate_s": round(generated, 1),
              "workers": args.workers, "load_avg_before": load_before, "load_avg_after": load_after, "runs": rows}
    print(f"\n{args.small_files:,} small files + one {corpus['big_bytes'] / 1e9:.2f} GB file ({corpus['docs']:,} documents), "
          f"threadpool x {args.workers}; load avg before {load_before}, after {load_after}\n")
    print("| shards | tasks | plan (s) | plan RSS (MiB) | run (s) | CPU (s) | peak RSS (MiB) | longest task (s) | median task (s) |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        name = f"approx_shard_bytes={r['approx_shard_bytes']:,}" if r["approx_shard_bytes"] else "one per file (before)"
        print(f"| {name} | {r['tasks']:,} | {r['plan_s']} | {r['plan_rss_mib']} | {r['run_s']} | {r['cpu_s']} | "
              f"{r['peak_rss_mib']:,.0f} | {r['longest_task_s']} | {r['median_task_s']} |")
    print(f"\nsized plan: {rows[1]['describe']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
