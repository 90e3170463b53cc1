"""What publishing the run state (issue 15) costs: W1 on a warm Ray with it off, on, and watched.

W1 is the pipeline of `bench_ray_backend.py` (decode JSONL.zst, annotate, filter, write
JSONL.zst; 16 shards of 8,000 documents by default). Three variants run in alternating rounds
on the same warm local Ray and the same corpus:

- off: the runner as it was before issue 15: no `RunStatus` (a no-op stands in), no
  `ObservedBackend`, no run record. The baseline.
- on: the default: every task's life is reported to the run's `RunStatus` and the final
  snapshot is written as `.zephyr-run.json`; nobody looks.
- watched: on, plus a status page served by the driver and a client fetching the whole
  snapshot every `--poll` seconds for the entire run (much more often than a browser does).

Part 2 isolates the per-shard and per-item costs that the end-to-end medians cannot resolve:
2,000 one-item shards on a 2-thread threadpool (driver-side hooks per shard, off vs on), and
the per-item counter of `items_in` (`zephyr.execution.shard._counted`) against a bare iterator.

    RAY_ENABLE_UV_RUN_RUNTIME_ENV=0 uv run python benchmarks/bench_status.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
import timeit
import urllib.request
from contextlib import contextmanager

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ray_backend import run_tiny, run_zephyr, w1_corpus  # noqa: E402  (the W1 pipeline and its input, verbatim)
from machine import load_average, machine, start_local_ray, work_dir  # noqa: E402


class _Unpublished:
    """Stands in for RunStatus in the `off` variant: every report is a no-op, no record."""

    record_path = None
    run_id = "off"

    def __getattr__(self, name):
        return lambda *args, **kwargs: None


@contextmanager
def publishing_off():
    """The runner without its status hooks: what it was before issue 15."""
    import zephyr.execution.report as report
    import zephyr.execution.runner as runner

    saved = report.RunStatus, runner.ObservedBackend, report.status_registry.publish
    report.RunStatus = lambda *args, **kwargs: _Unpublished()
    runner.ObservedBackend = lambda backend, *args, **kwargs: backend
    report.status_registry.publish = lambda status: None
    try:
        yield
    finally:
        report.RunStatus, runner.ObservedBackend, report.status_registry.publish = saved


@contextmanager
def watched(poll: float):
    """A status page and a client fetching the full snapshot every `poll` seconds."""
    from zephyr.status import start_dashboard

    dashboard = start_dashboard()
    stop = threading.Event()
    fetched = [0]

    def client():
        while not stop.is_set():
            with urllib.request.urlopen(dashboard.url + "api/snapshot", timeout=30) as response:
                json.loads(response.read())
            fetched[0] += 1
            stop.wait(poll)

    thread = threading.Thread(target=client, daemon=True)
    thread.start()
    try:
        yield fetched
    finally:
        stop.set()
        thread.join(timeout=30)
        dashboard.stop()


def cpu_seconds() -> float:
    """User + system CPU of this process and all its descendants (Ray's GCS, raylet and workers).

    Far less sensitive than wall time to other work on a shared machine: what the run itself burnt.
    """
    import psutil

    total = 0.0
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        try:
            t = proc.cpu_times()
            total += t.user + t.system
        except psutil.NoSuchProcess:  # a process that ended takes its (small) count with it
            pass
    return total


def timed_run(variant: str, backend, paths, out_dir: str, poll: float) -> tuple[float, float, float, int]:
    """(wall seconds, driver CPU seconds, CPU seconds of everything, snapshots fetched) of one W1 run."""
    cpu, everything = time.process_time(), cpu_seconds()
    fetched = [0]
    if variant == "off":
        with publishing_off():
            wall = run_zephyr(backend, paths, out_dir)
    elif variant == "watched":
        with watched(poll) as fetched:
            wall = run_zephyr(backend, paths, out_dir)
    else:
        wall = run_zephyr(backend, paths, out_dir)
    return wall, time.process_time() - cpu, cpu_seconds() - everything, fetched[0]


def per_shard_cost(num_shards: int, repeats: int) -> dict:
    """Driver-side cost per shard, off vs on: one-item shards on a 2-thread threadpool (best of `repeats`)."""
    from zephyr import create_backend

    backend = create_backend("threadpool", max_parallelism=2, progress=False)
    times = {"off": [], "on": []}
    try:
        run_tiny(backend, 200)
        for _ in range(repeats):
            with publishing_off():
                times["off"].append(run_tiny(backend, num_shards))
            times["on"].append(run_tiny(backend, num_shards))
    finally:
        backend.close()
    best = {k: min(v) for k, v in times.items()}
    return {"shards": num_shards, "us_per_shard_off": round(best["off"] / num_shards * 1e6, 1),
            "us_per_shard_on": round(best["on"] / num_shards * 1e6, 1),
            "hooks_us_per_shard": round((best["on"] - best["off"]) / num_shards * 1e6, 1)}


def per_item_cost() -> dict:
    """ns per item of `_counted` (the items_in count) over a bare iterator."""
    from zephyr.execution.shard import _counted

    items = list(range(1_000_000))
    bare = min(timeit.repeat(lambda: sum(1 for _ in iter(items)), number=1, repeat=5))
    counted = min(timeit.repeat(lambda: sum(1 for _ in _counted(iter(items))[0]), number=1, repeat=5))
    return {"ns_per_item_bare": round(bare / len(items) * 1e9, 1), "ns_per_item_counted": round(counted / len(items) * 1e9, 1),
            "counted_ns_per_item": round((counted - bare) / len(items) * 1e9, 1)}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter,
                                     epilog="example: uv run python benchmarks/bench_status.py --repeats 7 --json status.json")
    parser.add_argument("--shards", type=int, default=16, help="input shards (default 16)")
    parser.add_argument("--docs-per-shard", type=int, default=8000, help="documents per shard (default 8000)")
    parser.add_argument("--cores", type=int, default=2, help="Ray num_cpus (default 2)")
    parser.add_argument("--repeats", type=int, default=7, help="rounds; each runs off, on and watched once (default 7)")
    parser.add_argument("--poll", type=float, default=0.2, help="seconds between the watcher's snapshot fetches (default 0.2)")
    parser.add_argument("--tiny-shards", type=int, default=2000, help="one-item shards for the per-shard cost (default 2000; 0 skips)")
    parser.add_argument("--work-dir", default=None, help="where the corpus and outputs go (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    args = parser.parse_args(argv)
    for name in ("shards", "docs_per_shard", "cores", "repeats"):
        if getattr(args, name) <= 0:
            parser.error(f"--{name.replace('_', '-')} must be positive, got {getattr(args, name)}")
    if args.poll <= 0 or args.tiny_shards < 0:
        parser.error("--poll must be > 0 and --tiny-shards >= 0")
    return args


def main(argv=None) -> dict:
    args = parse_args(argv)
    with work_dir(args.work_dir, "zephyr-bench-status-") as work:
        return _bench(args, work)


def _bench(args: argparse.Namespace, work: str) -> dict:
    import ray
    from zephyr import create_backend

    load_before = load_average()
    info = w1_corpus(os.path.join(work, "corpus"), args.shards, args.docs_per_shard)
    paths = list(info.paths)
    start_local_ray(args.cores)
    backend = create_backend("ray", progress=False)
    variants = ("off", "on", "watched")
    runs: dict[str, list] = {v: [] for v in variants}
    loads = []
    try:
        run_zephyr(backend, paths, os.path.join(work, "out"))  # warm-up: workers start and import
        for round_ in range(args.repeats):
            loads.append(round(os.getloadavg()[0], 2))
            order = variants if round_ % 2 == 0 else tuple(reversed(variants))  # neither goes first every time
            for variant in order:
                runs[variant].append(timed_run(variant, backend, paths, os.path.join(work, "out"), args.poll))
        record = os.path.join(work, "out", ".zephyr-run.json")
        record_bytes = os.path.getsize(record) if os.path.exists(record) else 0
    finally:
        backend.close()
        ray.shutdown()
    tiny = per_shard_cost(args.tiny_shards, 5) if args.tiny_shards else {}
    item = per_item_cost()

    med = {v: statistics.median(r[0] for r in runs[v]) for v in variants}
    best = {v: min(r[0] for r in runs[v]) for v in variants}
    cpu = {v: statistics.median(r[2] for r in runs[v]) for v in variants}
    result = {
        "benchmark": "status",
        "machine": machine(),
        "load_avg_before": load_before,
        "load_avg_after": load_average(),
        "load_avg_1min_per_round": loads,
        "params": vars(args) | {"docs": info.num_docs, "input_mb": round(info.bytes_uncompressed / 1e6, 1)},
        "w1": {v: {"runs_s": [round(r[0], 3) for r in runs[v]], "median_s": round(med[v], 3), "best_s": round(best[v], 3),
                   "driver_cpu_s_median": round(statistics.median(r[1] for r in runs[v]), 3),
                   "cpu_s": [round(r[2], 3) for r in runs[v]], "cpu_s_median": round(cpu[v], 3),
                   "snapshots_fetched": sum(r[3] for r in runs[v])} for v in variants},
        "on_vs_off_median": round(med["on"] / med["off"], 4),
        "on_vs_off_best": round(best["on"] / best["off"], 4),
        "watched_vs_off_median": round(med["watched"] / med["off"], 4),
        "watched_vs_off_best": round(best["watched"] / best["off"], 4),
        "on_vs_off_cpu": round(cpu["on"] / cpu["off"], 4),
        "watched_vs_off_cpu": round(cpu["watched"] / cpu["off"], 4),
        "record_bytes": record_bytes,
        "per_shard": tiny,
        "per_item": item,
    }
    per_shard_s = med["off"] * args.cores / args.shards
    result["estimated_overhead_pct"] = round(100 * (
        (tiny.get("hooks_us_per_shard", 0) * 1e-6 * args.shards / med["off"])
        + item["counted_ns_per_item"] * 1e-9 * args.docs_per_shard / per_shard_s), 3)
    print_table(result)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


def print_table(r: dict) -> None:
    p, m = r["params"], r["machine"]
    print(f"\nPublishing the run state on W1: {p['shards']} shards x {p['docs_per_shard']:,} docs = {p['docs']:,} docs, "
          f"{p['input_mb']} MB JSONL in; warm local Ray with {p['cores']} CPUs; {p['repeats']} alternating rounds")
    print(f"machine: {m['cores']} cores, {m['ram_gib']} GiB, Python {m['python']}, Ray {m['ray']}; "
          f"load avg before {r['load_avg_before']}, after {r['load_avg_after']}")
    print()
    print("| variant | wall, runs (s) | wall median (s) | wall best (s) | vs off (median) | vs off (best) | "
          "CPU, runs (s) | CPU median (s) | CPU vs off | driver CPU (s, median) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    ratios = {"off": (1.0, 1.0, 1.0), "on": (r["on_vs_off_median"], r["on_vs_off_best"], r["on_vs_off_cpu"]),
              "watched": (r["watched_vs_off_median"], r["watched_vs_off_best"], r["watched_vs_off_cpu"])}
    for v in ("off", "on", "watched"):
        w = r["w1"][v]
        print(f"| {v} | {', '.join(f'{x:.2f}' for x in w['runs_s'])} | {w['median_s']:.3f} | {w['best_s']:.3f} | "
              f"{ratios[v][0]:.4f} | {ratios[v][1]:.4f} | {', '.join(f'{x:.2f}' for x in w['cpu_s'])} | "
              f"{w['cpu_s_median']:.3f} | {ratios[v][2]:.4f} | {w['driver_cpu_s_median']:.3f} |")
    print(f"\nwatched: {r['w1']['watched']['snapshots_fetched']} snapshots fetched in all; run record {r['record_bytes']:,} bytes")
    print(f"1-minute load average at the start of each round: {', '.join(str(x) for x in r['load_avg_1min_per_round'])}")
    if r["per_shard"]:
        t = r["per_shard"]
        print(f"\nper shard (driver), {t['shards']:,} one-item shards on a 2-thread threadpool, best of 5: "
              f"{t['us_per_shard_off']} us off, {t['us_per_shard_on']} us on: hooks {t['hooks_us_per_shard']} us per shard")
    i = r["per_item"]
    print(f"per item (worker), items_in count: {i['ns_per_item_counted']} ns vs {i['ns_per_item_bare']} ns bare: "
          f"{i['counted_ns_per_item']} ns per item")
    print(f"estimated overhead on W1 from those: {r['estimated_overhead_pct']}%")


if __name__ == "__main__":
    main()
