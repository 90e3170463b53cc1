"""Parquet projection + filter pushdown: bytes read and time, with and without it (issue 12).

    uv run python benchmarks/bench_parquet_pushdown.py --json benchmarks/results/parquet_pushdown.json

Data: `--files` Parquet files of `--rows-per-file` rows `{"id", "score", "lang", "text"}`
(ids ascending across files, `text` ~`--text-bytes` of hex, so it hardly compresses), in row
groups of `--rows-per-group`. Query: the rows with `id` in a window of `--selectivity` of the
ids, projected to `id` and `score`. Three runners, each on the sync backend (one core, one
process, so the readers are compared, not scheduling), alternated round by round:

- zephyr with pushdown: `load_parquet().filter((col("id") >= lo) & (col("id") < hi)).select("id", "score")`
- zephyr without it: the same query as a Python `filter(lambda)` and `map` (every row decoded)
- hand-written pyarrow: `pyarrow.dataset.dataset(files).to_table(filter=..., columns=...)`,
  the floor a reader can reach.

Reports `zephyr/bytes_read` (bytes fetched from the files) and the median seconds of
`--repeats` rounds (after one unreported warm-up round: imports, page cache), with ratios
against the no-pushdown runner.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import load_average, machine  # noqa: E402


def generate(directory: Path, files: int, rows_per_file: int, rows_per_group: int, text_bytes: int) -> list[str]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    directory.mkdir(parents=True, exist_ok=True)
    manifest = directory / "manifest.json"
    wanted = {"files": files, "rows_per_file": rows_per_file, "rows_per_group": rows_per_group, "text_bytes": text_bytes}
    paths = [str(directory / f"part-{i:04d}.parquet") for i in range(files)]
    if manifest.exists() and json.loads(manifest.read_text()) == wanted:
        return paths
    digests = (text_bytes + 63) // 64
    for f, path in enumerate(paths):
        start = f * rows_per_file
        ids = range(start, start + rows_per_file)
        text = ["".join(hashlib.sha256(f"{i}:{k}".encode()).hexdigest() for k in range(digests))[:text_bytes] for i in ids]
        table = pa.table({"id": list(ids), "score": [(i * 7919 % 1000) / 1000 for i in ids],
                          "lang": ["en" if i % 3 else "fr" for i in ids], "text": text})
        pq.write_table(table, path, row_group_size=rows_per_group)
    manifest.write_text(json.dumps(wanted))
    return paths


def run_zephyr(paths: list[str], lo: int, hi: int, pushdown: bool) -> tuple[float, int, int]:
    from zephyr import Dataset, col, create_backend

    ds = Dataset.from_files(paths).load_parquet()
    if pushdown:
        ds = ds.filter((col("id") >= lo) & (col("id") < hi)).select("id", "score")
    else:
        ds = ds.filter(lambda r: lo <= r["id"] < hi).map(lambda r: {"id": r["id"], "score": r["score"]})
    backend = create_backend("sync", progress=False)
    start = time.perf_counter()
    execution = backend.execute(ds)
    rows = sum(1 for _ in execution)
    return time.perf_counter() - start, execution.counters["zephyr/bytes_read"], rows


def run_pyarrow(paths: list[str], lo: int, hi: int) -> tuple[float, int, int]:
    import pyarrow.compute as pc
    import pyarrow.dataset as pads

    start = time.perf_counter()
    table = pads.dataset(paths, format="parquet").to_table(columns=["id", "score"], filter=(pc.field("id") >= lo) & (pc.field("id") < hi))
    rows = len(table.to_pylist())  # the same Python dicts zephyr hands on
    return time.perf_counter() - start, -1, rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4, help="Parquet files")
    parser.add_argument("--rows-per-file", type=int, default=200_000, help="rows per file")
    parser.add_argument("--rows-per-group", type=int, default=10_000, help="rows per row group")
    parser.add_argument("--text-bytes", type=int, default=150, help="bytes of hex text per row")
    parser.add_argument("--selectivity", type=float, default=0.01, help="fraction of the ids the filter keeps")
    parser.add_argument("--repeats", type=int, default=3, help="rounds; medians are reported")
    parser.add_argument("--work-dir", help="keep the data here between runs (default: a temporary directory)")
    parser.add_argument("--json", help="write every figure to this file")
    args = parser.parse_args(argv)

    load_before = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        directory = Path(args.work_dir or tmp) / "parquet"
        paths = generate(directory, args.files, args.rows_per_file, args.rows_per_group, args.text_bytes)
        total_bytes = sum(os.path.getsize(p) for p in paths)
        total_rows = args.files * args.rows_per_file
        lo = total_rows // 3
        hi = lo + max(1, int(total_rows * args.selectivity))
        runners = {
            "zephyr, pushdown": lambda: run_zephyr(paths, lo, hi, pushdown=True),
            "zephyr, Python filter (no pushdown)": lambda: run_zephyr(paths, lo, hi, pushdown=False),
            "hand-written pyarrow.dataset scan": lambda: run_pyarrow(paths, lo, hi),
        }
        seconds: dict[str, list[float]] = {name: [] for name in runners}
        bytes_read: dict[str, int] = {}
        for runner in runners.values():  # warm-up round, not reported: imports, page cache
            runner()
        for _ in range(args.repeats):
            for name, runner in runners.items():
                elapsed, read, rows = runner()
                assert rows == hi - lo, f"{name}: {rows} rows, expected {hi - lo}"
                seconds[name].append(elapsed)
                bytes_read[name] = read
    load_after = load_average()

    base = statistics.median(seconds["zephyr, Python filter (no pushdown)"])
    base_bytes = bytes_read["zephyr, Python filter (no pushdown)"]
    print(f"{args.files} files, {total_rows} rows, {total_bytes / 1e6:.1f} MB; query keeps {hi - lo} rows "
          f"({args.selectivity:.1%}), 2 of 4 columns; load average before {load_before}, after {load_after}\n")
    print("| runner | bytes read | of the files | median (s) | runs (s) | time vs no pushdown |")
    print("|---|---|---|---|---|---|")
    rows_out = []
    for name in runners:
        median = statistics.median(seconds[name])
        read = bytes_read[name]
        shown = f"{read / 1e6:.2f} MB" if read >= 0 else "n/a"
        share = f"{read / total_bytes:.1%}" if read >= 0 else "n/a"
        runs = ", ".join(f"{s:.2f}" for s in seconds[name])
        print(f"| {name} | {shown} | {share} | {median:.2f} | {runs} | {median / base:.3f}x |")
        rows_out.append({"runner": name, "bytes_read": read, "seconds": seconds[name], "median_s": median, "ratio_vs_no_pushdown": median / base})
    if args.json:
        Path(args.json).write_text(json.dumps({
            "args": vars(args), "machine": machine(), "load_before": load_before, "load_after": load_after,
            "total_bytes": total_bytes, "rows_kept": hi - lo, "bytes_ratio": bytes_read["zephyr, pushdown"] / base_bytes,
            "runners": rows_out,
        }, indent=2) + "\n")


if __name__ == "__main__":
    main()
