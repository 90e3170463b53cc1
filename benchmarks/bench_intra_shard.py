"""Does `IntraShardExecution.AUTO` put idle cores to work on one big input file?

One Parquet file (one shard) of `--rows` short texts; the pipeline is a CPU-bound Python map
(`--work` SHA-256 rounds per row) written back to Parquet. Variants, each `--repeats` times,
all back to back: zephyr through `ZephyrContext` on the sync backend with intra-shard execution
OFF (one task: one core) and AUTO (`--workers` processes), and a hand-written baseline: the
same map over the same rows with `multiprocessing.Pool.imap` in `--workers` processes (chunks of
1,024 rows, the order kept), written with pyarrow. The outputs are compared with each other.

    uv run python benchmarks/bench_intra_shard.py --json benchmarks/results/intra_shard.json
"""

from __future__ import annotations

import argparse
import functools
import hashlib
import json
import multiprocessing
import os
import statistics
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, work_dir  # noqa: E402

def heavy(row: dict, work: int) -> dict:
    """A CPU-bound per-row function: `work` rounds of SHA-256."""
    digest = row["text"].encode()
    for _ in range(work):
        digest = hashlib.sha256(digest).digest()
    return {"id": row["id"], "text": row["text"], "h": digest.hex()[:16]}


def make_input(path: str, rows: int) -> None:
    import pyarrow as pa
    import pyarrow.parquet as pq

    pq.write_table(pa.table({"id": range(rows), "text": [f"document {i} " * 8 for i in range(rows)]}), path, row_group_size=rows)


def run_zephyr(src: str, out_dir: str, mode: str, workers: int, fn) -> float:
    from zephyr.context import IntraShardExecution, ResourceConfig, ZephyrContext
    from zephyr.dataset import Dataset

    ctx = ZephyrContext(client="sync", max_workers=workers, resources=ResourceConfig(cpu=1, ram="1g"),
                        intra_shard_execution=IntraShardExecution(mode))
    start = time.perf_counter()
    try:
        ctx.execute(Dataset.from_files(src).load_parquet().map(fn).write_parquet(os.path.join(out_dir, "part-{shard}.parquet")))
    finally:
        ctx.shutdown()
    return time.perf_counter() - start


def run_pool(src: str, out_dir: str, workers: int, fn) -> float:
    import pyarrow as pa
    import pyarrow.parquet as pq

    start = time.perf_counter()
    rows = pq.read_table(src).to_pylist()
    with multiprocessing.get_context("spawn").Pool(workers) as pool:
        out = list(pool.imap(fn, rows, chunksize=1024))
    os.makedirs(out_dir, exist_ok=True)
    pq.write_table(pa.Table.from_pylist(out), os.path.join(out_dir, "part-0.parquet"))
    return time.perf_counter() - start


def rows_of(out_dir: str) -> list:
    import pyarrow.parquet as pq

    return pq.read_table(os.path.join(out_dir, "part-0.parquet")).to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=100_000)
    parser.add_argument("--work", type=int, default=200, help="SHA-256 rounds per row")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--work-dir")
    parser.add_argument("--json")
    args = parser.parse_args()
    with work_dir(args.work_dir, "bench-intra-shard-") as work:
        os.makedirs(work, exist_ok=True)
        src = os.path.join(work, "input.parquet")
        make_input(src, args.rows)
        fn = functools.partial(heavy, work=args.work)
        runs = []
        for repeat in range(args.repeats):
            run = {"load_before": load_average()}
            for variant in ("off", "auto", "pool"):
                out = os.path.join(work, f"out-{variant}-{repeat}")
                run[variant] = run_pool(src, out, args.workers, fn) if variant == "pool" else run_zephyr(src, out, variant, args.workers, fn)
            run["same_rows"] = rows_of(os.path.join(work, f"out-off-{repeat}")) == rows_of(os.path.join(work, f"out-auto-{repeat}")) \
                == rows_of(os.path.join(work, f"out-pool-{repeat}"))
            runs.append(run)
            print(json.dumps(run), file=sys.stderr, flush=True)
    median = {v: round(statistics.median(r[v] for r in runs), 2) for v in ("off", "auto", "pool")}
    result = {"rows": args.rows, "work": args.work, "workers": args.workers, "cores": os.cpu_count(), "runs": runs, "median_s": median,
              "auto_over_off": round(median["off"] / median["auto"], 2), "auto_over_pool": round(median["pool"] / median["auto"], 2),
              "load_after": load_average()}
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        with open(args.json, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
