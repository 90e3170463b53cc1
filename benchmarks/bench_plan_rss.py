"""Driver memory while planning the reduce stage of a 10,000 map x 1,000 reduce shuffle.

The driver holds one summary per map shard (what its task returned, or its manifest on
resume) and turns them into reduce tasks. This measures the peak RSS of a fresh process that
builds 10,000 map summaries in the format `ScatterSink` writes (one run each, its 1,001
partition offsets packed), holds them as the runner does (`ShardResult`s) and calls
`ShuffleReader.tasks`, i.e. the real planning code. Offsets are synthetic (random partition
sizes); nothing is read from disk, so the figure is the planning cost alone.

`--legacy` runs the representation this replaced (per run a dict of partition -> [offset,
length], and per reduce task a tuple of (path, offset, length) for every run), rebuilt here
in a few lines for comparison, at the same scale.

    uv run python benchmarks/bench_plan_rss.py --json benchmarks/results/plan_rss.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine  # noqa: E402


def _rss_mib(field: str = "VmHWM") -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(field)


def _summaries(maps: int, partitions: int, legacy: bool) -> list:
    from zephyr.shuffle.run_index import pack
    from zephyr.tasks import ShardResult

    rng = np.random.default_rng(0)
    results = []
    for m in range(maps):
        sizes = rng.integers(1_000, 100_000, size=partitions)
        offsets = np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64)
        path = f"gs://bucket/scratch/0123456789abcdef/map-{m:05d}-run-1a2b3c4d-000.arrow"
        if legacy:
            run = {"path": path, "index": {str(p): [int(offsets[p]), int(sizes[p])] for p in range(partitions)}}
        else:
            run = {"path": path, "format": "arrow", "schema_len": 400, "offsets": pack(offsets), "batches": ""}
        summary = {"map_shard": m, "records": int(sizes.sum() // 300), "runs": [run], "counters": {"zephyr/shuffle_records": 1}}
        results.append(ShardResult(shard=m, items=None, summary=summary))
    return results


def _legacy_tasks(previous: list, partitions: int) -> list:
    """The planning this replaced: one (path, offset, length) tuple per run in every reduce task."""
    ranges: list[list[tuple]] = [[] for _ in range(partitions)]
    for result in previous:
        for run in result.summary["runs"]:
            for p, (offset, length) in run["index"].items():
                ranges[int(p)].append((run["path"], offset, length))
    return [tuple(r) for r in ranges]


def child(maps: int, partitions: int, legacy: bool) -> dict:
    from zephyr.plan.compile import Stage
    from zephyr.shuffle.reduce import FirstPerKey, ShuffleReader

    start_rss = _rss_mib("VmRSS")
    t0 = time.perf_counter()
    previous = _summaries(maps, partitions, legacy)
    held = _rss_mib("VmRSS")
    t1 = time.perf_counter()
    if legacy:
        tasks = _legacy_tasks(previous, partitions)
    else:
        reader = ShuffleReader(partitions, FirstPerKey(), "deduplicate(key)")
        tasks = reader.tasks(Stage(1, (), partitions, reader), previous)
    t2 = time.perf_counter()
    assert len(tasks) == partitions
    return {"legacy": legacy, "maps": maps, "partitions": partitions, "rss_start_mib": round(start_rss, 1),
            "rss_after_summaries_mib": round(held, 1), "peak_rss_mib": round(_rss_mib(), 1),
            "summaries_s": round(t1 - t0, 2), "plan_s": round(t2 - t1, 2)}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: uv run python benchmarks/bench_plan_rss.py --maps 10000 --partitions 1000")
    parser.add_argument("--maps", type=int, default=10_000, help="map shards (default 10,000)")
    parser.add_argument("--partitions", type=int, default=1_000, help="reduce shards (default 1,000)")
    parser.add_argument("--legacy", action="store_true", help="also measure the replaced representation")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        print("RESULT " + json.dumps(child(args.maps, args.partitions, args.child == "legacy")), flush=True)
        return
    load_before = load_average()
    rows = []
    for kind in ["compact"] + (["legacy"] if args.legacy else []):
        proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--maps", str(args.maps), "--partitions",
                               str(args.partitions), "--child", kind], capture_output=True, text=True, check=False)
        if proc.returncode != 0:
            raise SystemExit(f"{kind} run failed:\n{proc.stderr[-3000:]}")
        rows.append(json.loads(next(l for l in proc.stdout.splitlines() if l.startswith("RESULT "))[7:]))
    result = {"benchmark": "plan_rss", "machine": machine(), "load_avg_before": load_before, "load_avg_after": load_average(),
              "runs": rows}
    print(f"\nPlanning {args.maps:,} map x {args.partitions:,} reduce shards; load avg before {load_before}, after {result['load_avg_after']}\n")
    print("| run index | RSS at start (MiB) | RSS holding the summaries (MiB) | peak RSS (MiB) | build summaries (s) | plan (s) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        name = "per-run dicts, per-task tuples (before)" if r["legacy"] else "packed arrays (`RunIndex`)"
        print(f"| {name} | {r['rss_start_mib']:,.0f} | {r['rss_after_summaries_mib']:,.0f} | {r['peak_rss_mib']:,.0f} | "
              f"{r['summaries_s']} | {r['plan_s']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)


if __name__ == "__main__":
    main()
