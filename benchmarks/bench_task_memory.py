"""Task memory with big records, and what measuring a task costs (issue 29).

Part 1: a shuffle (one map shard -> group_by over 5 keys -> write) of records of `--record-mb`
MB each, on the sync backend, for each memory budget; each configuration in a fresh process.
Reported per stage: the task's rise of its process's resident set (`StageCost.rss_rise`,
measured by `zephyr.execution.usage`) against the budget. `--legacy` runs the same with the
scatter's chunking as it was before issue 29 (the first chunk 256 records, at least 64 records
per chunk and per Arrow run batch), by setting the module constants it reads.

Part 2: the cost of `measuring()` around a task that does nothing (microseconds per task).

    uv run python benchmarks/bench_task_memory.py --json benchmarks/results/task_memory.json
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine  # noqa: E402

MIB = 1 << 20


def _records(spec):
    size, count = spec
    for i in range(count):
        yield {"k": i % 5, "v": "x" * size}


def _count(k, items):
    return {"k": k, "n": sum(1 for _ in items)}


def one(record_mb: float, count: int, budget: int | None, legacy: bool, out: str) -> dict:
    from zephyr import Dataset, create_backend
    from zephyr.shuffle import runs, scatter

    if legacy:
        scatter.FIRST_CHUNK_ROWS, scatter.MIN_CHUNK_ROWS, runs.MIN_BATCH_ROWS = 256, 64, 64
    ds = (Dataset.from_list([(int(record_mb * 1e6), count)]).flat_map(_records).group_by(lambda r: r["k"], _count)
          .write_jsonl(out + "/{shard}.jsonl"))
    start = time.perf_counter()
    execution = create_backend("sync", progress=False, memory=budget).execute(ds)
    list(execution)
    return {"record_mb": record_mb, "records": count, "budget": budget, "legacy": legacy,
            "seconds": round(time.perf_counter() - start, 2),
            "rss_rise_mib": [round(s.cost.rss_rise / MIB) for s in execution.stats],
            "shuffle_runs": execution.counters["zephyr/shuffle_runs"]}


def overhead(n: int = 20000) -> float:
    from zephyr.execution.usage import measuring

    best = float("inf")
    for _ in range(5):
        start = time.perf_counter()
        for _ in range(n):
            with measuring():
                pass
        best = min(best, (time.perf_counter() - start) / n * 1e6)
    return round(best, 1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--record-mb", type=float, default=2.0)
    parser.add_argument("--records", type=int, default=300)
    parser.add_argument("--json", default=None)
    parser.add_argument("--one", default=None, help=argparse.SUPPRESS)  # a configuration, in a child process
    args = parser.parse_args()
    if args.one:
        budget, legacy, out = json.loads(args.one)
        print(json.dumps(one(args.record_mb, args.records, budget, legacy, out)))
        return
    import tempfile

    rows = []
    print(f"machine: {machine()}; load before: {load_average()}")
    for budget in (64 * MIB, 256 * MIB, None):
        for legacy in (True, False):
            with tempfile.TemporaryDirectory() as out:
                done = subprocess.run([sys.executable, __file__, "--record-mb", str(args.record_mb), "--records",
                                       str(args.records), "--one", json.dumps([budget, legacy, out])],
                                      capture_output=True, text=True, check=True)
            row = json.loads(done.stdout.strip().splitlines()[-1])
            rows.append(row)
            label = f"{budget // MIB} MiB" if budget else "none"
            print(f"budget {label:>8}  {'before' if legacy else 'after ':6}  rise per stage (MiB) {row['rss_rise_mib']}  "
                  f"runs {row['shuffle_runs']}  {row['seconds']}s")
    per_task = overhead()
    print(f"measuring() around an empty task: {per_task} us (best of 5 x 20,000)")
    print(f"load after: {load_average()}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"machine": machine(), "runs": rows, "measure_us_per_task": per_task}, f, indent=1)


if __name__ == "__main__":
    main()
