"""Column-expression pipelines on Arrow batches (issue 26): zephyr vs Polars, DuckDB and Daft.

Three jobs, each variant in its own fresh process, on the same corpus and all cores:
  - dedup: keep the first document per `text` of bench_dedup.py's corpus (2,000,000 docs, 10%
    exact duplicates, 616 MB of JSONL in 8 JSONL.zst shards), write JSONL.zst;
  - w1: bench_ray_backend.py's W1 input, add `num_chars` and keep documents of at least
    `--min-chars` characters, write JSONL.zst;
  - parquet: W1's two ops on the dedup corpus (`--parquet-min-chars`), write Parquet (Snappy,
    every tool's default).
`--plain` writes the JSON lines uncompressed, for every tool (Daft writes no other form).
Zephyr runs on a warm local Ray (as bench_dedup.py's Ray variant: seconds exclude ray.init and
a warm-up) with `memory=--memory`, once on batches (`deduplicate(col("text"))`,
`with_columns(...).filter(col(...))`) and once on records (`ZEPHYR_COLUMNAR=0`, the same
pipeline); the two must write the same bytes. Peak RSS: each Ray worker's high-water mark
(VmHWM) for zephyr, the process's for the peers (which run in-process). Each variant runs
`--runs` times in its one process (zephyr: on the same Ray workers): the table gives the first
run (libraries loaded and warmed by it) and the fastest later one ("warm").

    uv run --group bench python benchmarks/bench_columnar.py --json benchmarks/results/columnar.json
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import subprocess
import sys
import time

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_dedup import (
    _proc_cpu_s,
    _ray_worker_rss_mib,
    _status_kib,
    kept_ids,
    reset_peak_rss,
)
from bench_ray_backend import w1_corpus
from columnar_peers import DAFT_COMMAND, PEERS, run_peer_runs, runs_result
from corpus import ensure_corpus
from machine import load_average, machine, start_local_ray, work_dir

ZEPHYR = ("zephyr-batches", "zephyr-records")


def zephyr_pipeline(job: str, paths: list[str], out_dir: str, min_chars: int, plain: bool = False):
    from zephyr import Dataset, col

    ds = Dataset.from_files(list(paths)).load_jsonl()
    if job == "dedup":
        ds = ds.deduplicate(col("text"))
    elif job == "count":
        return ds.group_by("domain", num_output_shards=1).count().write_jsonl(
            os.path.join(out_dir, "part-{shard:05d}.jsonl" + ("" if plain else ".zst")))
    else:
        ds = ds.with_columns(num_chars=col("text").str_len()).filter(col("num_chars") >= min_chars)
    if job == "parquet":
        return ds.write_parquet(os.path.join(out_dir, "part-{shard:05d}.parquet"))
    return ds.write_jsonl(os.path.join(out_dir, "part-{shard:05d}.jsonl" + ("" if plain else ".zst")))


def run_zephyr(spec: dict) -> dict:
    import ray
    from zephyr import Dataset, create_backend

    start_local_ray(spec["cores"])
    runs = []
    try:
        backend = create_backend("ray", memory=spec["memory"], progress=False, scratch_dir=spec["scratch"])
        list(backend.execute(Dataset.from_list(list(range(4 * spec["cores"]))).reshard(2)))  # warm the workers
        idle = _ray_worker_rss_mib()
        for pid in idle:
            reset_peak_rss(pid)
        for _ in range(spec["runs"]):
            shutil.rmtree(spec["out_dir"], ignore_errors=True)
            pids = _ray_worker_rss_mib()
            cpu_before = {pid: _proc_cpu_s(pid) for pid in pids}
            driver_cpu = time.process_time()
            start = time.perf_counter()
            execution = backend.execute(zephyr_pipeline(spec["job"], spec["paths"], spec["out_dir"], spec["min_chars"], spec["plain"]))
            list(execution)
            seconds = time.perf_counter() - start
            after = _ray_worker_rss_mib()
            cpu = time.process_time() - driver_cpu + sum(_proc_cpu_s(pid) - cpu_before.get(pid, 0.0) for pid in after)
            runs.append((seconds, cpu))
        peaks = _ray_worker_rss_mib("VmHWM")
    finally:
        ray.shutdown()
    return runs_result(runs) | {
        "peak_rss_mib": round(max(peaks.values()), 1) if peaks else None,
        "rss_note": "per Ray worker", "engine_blocks": execution.counters.get("zephyr/engine_blocks", 0),
        "python_expressions": execution.counters.get("zephyr/python_expressions", 0),
        "shuffle_slices": execution.counters.get("zephyr/shuffle_slices", 0),
        "parquet_batches_as_records": execution.counters.get("zephyr/parquet_batches_as_records", 0)}


def child_main(spec: dict) -> None:
    os.environ["ZEPHYR_COLUMNAR"] = "0" if spec["variant"] == "zephyr-records" else "1"  # Ray's workers inherit it
    # Ray starts its workers at niceness 15, which a shared machine's other work starves: every
    # variant here runs at the default priority (as bench_dedup.py --niceness 0)
    os.environ["RAY_worker_niceness"] = "0"
    if spec["variant"] in ZEPHYR:
        result = run_zephyr(spec)
    else:
        reset_peak_rss()
        result = runs_result(run_peer_runs(spec)) | {"peak_rss_mib": round(_status_kib("VmHWM") / 1024, 1), "rss_note": "process"}
    print("RESULT " + json.dumps(result), flush=True)


def run_child(spec: dict) -> dict:
    command = DAFT_COMMAND if spec["variant"] == "daft" else [sys.executable, os.path.abspath(__file__), "--child"]
    proc = subprocess.run(command + [json.dumps(spec)],
                          capture_output=True, text=True, check=False, timeout=1800)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['variant']} failed (exit {proc.returncode}):\n{proc.stderr[-3000:]}")
    line = next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))
    return json.loads(line[len("RESULT "):])


def output_rows(out_dir: str) -> int:
    import zstandard

    rows = 0
    for root, _, names in os.walk(out_dir):
        for name in names:
            if name.endswith(".parquet") and not name.startswith("."):
                import pyarrow.parquet as pq

                rows += pq.ParquetFile(os.path.join(root, name)).metadata.num_rows
                continue
            if name.startswith(".") or not (".json" in name):
                continue
            with open(os.path.join(root, name), "rb") as f:
                data = zstandard.ZstdDecompressor().stream_reader(f).read() if name.endswith(".zst") else f.read()
            rows += data.count(b"\n")
    return rows


def derived_corpus(info, directory: str, job: str):
    """The corpus rewritten for a job: `w1dumps`, each line as Python's `json.dumps` writes it
    (spaces after ':' and ',', `\\uXXXX` escapes); `count`, each record with its url's host as
    `domain` (a few thousand distinct)."""
    import dataclasses

    import orjson
    import zstandard

    os.makedirs(directory, exist_ok=True)
    paths = []
    for path in info.paths:
        out = os.path.join(directory, os.path.basename(path))
        paths.append(out)
        if os.path.exists(out):
            continue
        with open(path, "rb") as f:
            lines = zstandard.ZstdDecompressor().stream_reader(f).read().splitlines()
        if job == "w1dumps":
            data = "".join(json.dumps(orjson.loads(line)) + "\n" for line in lines).encode()
        else:
            records = map(orjson.loads, lines)
            data = b"".join(orjson.dumps({**r, "domain": r["url"].split("/")[2]}) + b"\n" for r in records)
        with open(out + ".tmp", "wb") as f:
            f.write(zstandard.ZstdCompressor(level=3).compress(data))
        os.replace(out + ".tmp", out)
    return dataclasses.replace(info, paths=tuple(paths))


def same_records(a: str, b: str) -> bool:
    """Whether two output folders hold the same records (as exact JSON text, key order included;
    Parquet rows as read), whatever their files' bytes: the engine writes a row no op changed
    as the line it read, the record path writes orjson's form."""
    return _records_of(a) == _records_of(b)


def _records_of(out_dir: str) -> list[str]:
    import pyarrow.parquet as pq
    import zstandard

    rows = []
    for name in sorted(n for n in os.listdir(out_dir) if not n.startswith(".")):
        path = os.path.join(out_dir, name)
        if name.endswith(".parquet"):
            rows += [json.dumps(r, sort_keys=False) for r in pq.read_table(path).to_pylist()]
            continue
        with open(path, "rb") as f:
            data = zstandard.ZstdDecompressor().stream_reader(f).read() if name.endswith(".zst") else f.read()
        rows += [json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")) for line in data.splitlines()]
    return sorted(rows)


def _total_memory(memory: str, cores: int) -> str:
    from zephyr.resources import parse_memory

    return f"{parse_memory(memory) * cores // 2**20}MiB"


def run_job(args, work: str, job: str, paths: list[str], variants: list[str]) -> list[dict]:
    results = []
    for variant in variants:
        out_dir = os.path.join(work, f"out-{job}-{variant}")
        subprocess.run(["rm", "-rf", out_dir], check=True)
        spec = {"variant": variant, "job": job, "paths": paths, "out_dir": out_dir, "cores": args.cores,
                "memory": args.memory, "scratch": os.path.join(work, "scratch"),
                "min_chars": args.parquet_min_chars if job == "parquet" else args.min_chars, "plain": args.plain,
                "runs": args.runs, "peer_memory": args.peer_memory or _total_memory(args.memory, args.cores)}
        before = load_average()
        try:
            r = run_child(spec)
        except RuntimeError as e:
            print(f"{variant} failed: {e}", file=sys.stderr)
            results.append({"name": variant, "failed": str(e)[-400:]})
            continue
        r |= {"name": variant, "load_before": before, "load_after": load_average(), "rows_out": output_rows(out_dir)}
        if job == "dedup":
            r["kept_ids"] = kept_ids(out_dir)
        results.append(r)
        print(f"{job} {variant}: {r['seconds']:.2f} s, peak RSS {r['peak_rss_mib']} MiB, load {before}", flush=True)
    ok = [r for r in results if "failed" not in r]
    if job == "dedup":
        reference = next((r["kept_ids"] for r in ok if r["name"] == "zephyr-records"), None)
        for r in ok:
            ids = r.pop("kept_ids")
            r["kept_ids_digest"] = hashlib.sha256("\n".join(sorted(ids)).encode()).hexdigest()[:16]
            if reference is not None:
                r["same_ids_as_records"] = ids == reference
    names = [r["name"] for r in ok]
    if set(ZEPHYR) <= set(names):
        ok[names.index("zephyr-batches")]["same_records_as_records"] = same_records(
            os.path.join(work, f"out-{job}-zephyr-batches"), os.path.join(work, f"out-{job}-zephyr-records"))
    return results


def print_table(job: str, results: list[dict], corpus: dict) -> None:
    print(f"\n{job}: {corpus['docs']:,} docs, {corpus['mb_jsonl']} MB JSONL in {corpus['shards']} JSONL.zst shards")
    print("| variant | seconds | docs/s | vs zephyr on records | rows out | same as records | peak RSS (MiB) | CPU s | warm seconds | warm CPU s | load before |")
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    base = next((r for r in results if r["name"] == "zephyr-records" and "failed" not in r), None)
    for r in results:
        if "failed" in r:
            print(f"| {r['name']} | failed | | | | | | | | | |")
            continue
        same = r.get("same_records_as_records", r.get("same_ids_as_records", ""))
        ratio = f"{base['seconds'] / r['seconds']:.2f}x" if base else ""
        print(f"| {r['name']} | {r['seconds']:.2f} | {corpus['docs'] / r['seconds']:,.0f} | {ratio} | {r['rows_out']:,} | {same} "
              f"| {r['peak_rss_mib']} ({r['rss_note']}) | {r['cpu_s']:.1f} | {r.get('warm_seconds', 0):.2f} | {r.get('warm_cpu_s', 0):.1f} "
              f"| {r['load_before']} |")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=2_000_000, help="dedup corpus documents (default 2,000,000, as bench_dedup.py)")
    parser.add_argument("--shards", type=int, default=8, help="input shards of each corpus (default 8)")
    parser.add_argument("--w1-docs", type=int, default=400_000, help="W1 corpus documents (default 400,000; 200-2,000 chars each)")
    parser.add_argument("--min-chars", type=int, default=1000, help="W1's filter: num_chars >= this (default 1000)")
    parser.add_argument("--memory", default="256MiB", help="zephyr's task memory budget (default 256MiB)")
    parser.add_argument("--cores", type=int, default=os.cpu_count() or 1, help="cores for every variant (default: all)")
    parser.add_argument("--jobs", default="dedup,w1,parquet", help="which jobs (default dedup,w1,parquet; also w1dumps: W1 on "
                        "json.dumps-formatted input, count: rows per domain)")
    parser.add_argument("--parquet-min-chars", type=int, default=200, help="the parquet job's filter (default 200)")
    parser.add_argument("--runs", type=int, default=3, help="runs of each variant in its one process (default 3): the first, and the best later one")
    parser.add_argument("--plain", action="store_true", help="write JSON lines uncompressed, every tool (Daft's only form)")
    parser.add_argument("--peers", default=",".join(PEERS),
                        help="which peers (default polars,duckdb,daft; '' for none); also polars-streaming, duckdb-bounded")
    parser.add_argument("--peer-memory", default="",
                        help="duckdb-bounded's memory_limit (default: zephyr's --memory times --cores, what its tasks may hold)")
    parser.add_argument("--no-records", action="store_true", help="skip zephyr on records (ZEPHYR_COLUMNAR=0)")
    parser.add_argument("--work-dir", default=None, help="where corpora and outputs go (default: a temp dir, removed after)")
    parser.add_argument("--json", default=None, help="also write the results to this JSON file")
    parser.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        child_main(json.loads(args.child))
        return
    variants = list(ZEPHYR[:1] if args.no_records else ZEPHYR) + [p for p in args.peers.split(",") if p]
    out = {"benchmark": "columnar", "machine": machine(), "load_before": load_average(), "params": vars(args) | {"child": None}}
    with work_dir(args.work_dir, "zephyr-bench-columnar-") as work:
        for job in args.jobs.split(","):
            if job in ("dedup", "parquet", "count"):
                info = ensure_corpus(os.path.join(work, "corpus"), num_shards=args.shards, docs_per_shard=args.docs // args.shards,
                                     dup_fraction=0.1, min_chars=50, max_chars=400, seed=4)
            else:
                info = w1_corpus(os.path.join(work, "w1"), args.shards, args.w1_docs // args.shards)
            if job in ("w1dumps", "count"):
                info = derived_corpus(info, os.path.join(work, job), job)
            corpus = {"docs": info.num_docs, "mb_jsonl": round(info.bytes_uncompressed / 1e6, 1), "shards": args.shards}
            results = run_job(args, work, job, list(info.paths), variants)
            out[job] = {"corpus": corpus, "variants": results}
            print_table(job, results, corpus)
    out["load_after"] = load_average()
    print(f"\nmachine: {out['machine']}; load average before {out['load_before']}, after {out['load_after']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
