"""The two jobs of `bench_columnar.py` in Polars, DuckDB and Daft, each on all cores.

- dedup: read the JSONL.zst corpus, keep the first document per `text`, write JSON lines;
- w1: read, add `num_chars` (characters of `text`), keep documents with at least `min_chars`,
  write JSON lines;
- parquet: w1's ops, written as Parquet (Snappy).

JSON lines are zstd-compressed unless `plain` (then every tool writes them uncompressed).

Polars holds the whole corpus in memory (`read_ndjson` of each decompressed file, then one
frame) and its output is zstd-compressed (level 3, all cores) by `zstandard`; DuckDB reads
and writes `.jsonl.zst` itself (`COPY ... (FORMAT json, COMPRESSION zstd)`); Daft reads the
files itself and writes uncompressed JSON (its `write_json` has no compression option). Keep-
first order: Polars `unique(keep="first", maintain_order=True)`; DuckDB the first row of each
text by scan order (`row_number() OVER ()`); Daft `distinct("text")`, which does not say which
row of a group it keeps (so its kept ids may differ; the count must match).

Two peers run under a memory bound, as zephyr does (name them in `--peers`): `polars-streaming`
(Polars' streaming engine: `scan_ndjson` of the .jsonl.zst files, `sink_ndjson`/`sink_parquet`,
its output zstd level 3 unless `plain`) and `duckdb-bounded` (DuckDB with `memory_limit` set to
what zephyr's tasks may hold, `--memory` times `--cores`, spilling to disk beyond it).

Polars and DuckDB are in the bench group (`uv run --group bench python
benchmarks/bench_columnar.py`). Daft 0.7.26 pins pyarrow below the project's, so it runs in its
own environment: `bench_columnar.py` starts this file as a script under
`uv run --isolated --no-project --with daft==0.7.26` (`DAFT_COMMAND`), which prints the same
RESULT line a peer child of `bench_columnar.py` prints.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import sys
import time

__all__ = ["BOUNDED_PEERS", "DAFT_COMMAND", "PEERS", "run_peer", "run_peer_runs", "runs_result"]

PEERS = ("polars", "duckdb", "daft")
# peers under a memory bound, as zephyr runs (not in the default set: `--peers` names them)
BOUNDED_PEERS = ("polars-streaming", "duckdb-bounded")
DAFT_COMMAND = ["uv", "run", "--isolated", "--no-project", "--with", "daft==0.7.26", "--with", "zstandard", "python",
                os.path.abspath(__file__)]


def run_peer(name: str, job: str, paths: list[str], out_dir: str, cores: int, min_chars: int, plain: bool = False,
             memory_limit: str = "") -> None:
    os.makedirs(out_dir, exist_ok=True)
    if name == "duckdb-bounded":
        _duckdb(job, paths, out_dir, cores, min_chars, plain, memory_limit)
        return
    {"polars": _polars, "polars-streaming": _polars_streaming, "duckdb": _duckdb, "daft": _daft}[name](
        job, paths, out_dir, cores, min_chars, plain)


def run_peer_runs(spec: dict) -> list[tuple[float, float]]:
    """(seconds, CPU s of the process) of each of `spec["runs"]` runs in this process; the
    first run's CPU includes the interpreter's and the library's start."""
    runs = []
    cpu_before = 0.0
    for _ in range(spec.get("runs", 1)):
        shutil.rmtree(spec["out_dir"], ignore_errors=True)
        start = time.perf_counter()
        run_peer(spec["variant"], spec["job"], spec["paths"], spec["out_dir"], spec["cores"], spec["min_chars"], spec.get("plain", False),
                 spec.get("peer_memory", ""))
        seconds = time.perf_counter() - start
        usage = resource.getrusage(resource.RUSAGE_SELF)
        cpu = usage.ru_utime + usage.ru_stime
        runs.append((seconds, cpu - cpu_before))
        cpu_before = cpu
    return runs


def runs_result(runs: list[tuple[float, float]]) -> dict:
    """The first run's seconds and CPU s, and the fastest later run's (warm: the same process
    or Ray workers, their libraries loaded)."""
    result = {"seconds": runs[0][0], "cpu_s": runs[0][1], "runs": [[round(s, 3), round(c, 2)] for s, c in runs]}
    if len(runs) > 1:
        seconds, cpu = min(runs[1:])
        result |= {"warm_seconds": seconds, "warm_cpu_s": cpu}
    return result


def _polars(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int, plain: bool) -> None:
    os.environ["POLARS_MAX_THREADS"] = str(cores)  # read before polars is imported
    import io

    import polars as pl
    import zstandard

    frames = []
    for path in paths:
        with open(path, "rb") as f:
            frames.append(pl.read_ndjson(zstandard.ZstdDecompressor().stream_reader(f).read()))
    df = pl.concat(frames)
    del frames
    if job == "dedup":
        df = df.unique(subset=["text"], keep="first", maintain_order=True)
    elif job == "count":
        df = df.group_by("domain").len("count")
    else:
        df = df.with_columns(num_chars=pl.col("text").str.len_chars()).filter(pl.col("num_chars") >= min_chars)
    if job == "parquet":
        df.write_parquet(os.path.join(out_dir, "part-0.parquet"), compression="snappy")
        return
    if plain:
        df.write_ndjson(os.path.join(out_dir, "part-0.jsonl"))
        return
    buffer = io.BytesIO()
    df.write_ndjson(buffer)
    with open(os.path.join(out_dir, "part-0.jsonl.zst"), "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3, threads=cores).compress(buffer.getvalue()))


def _polars_streaming(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int, plain: bool) -> None:
    """Polars' streaming engine: it scans the .jsonl.zst files itself, a morsel at a time, and
    sinks its output (zstd level 3 unless `plain`) without collecting the frame."""
    os.environ["POLARS_MAX_THREADS"] = str(cores)
    import polars as pl

    lf = pl.scan_ndjson(list(paths))
    if job == "dedup":
        lf = lf.unique(subset=["text"], keep="first", maintain_order=True)
    elif job == "count":
        lf = lf.group_by("domain").len("count")
    else:
        lf = lf.with_columns(num_chars=pl.col("text").str.len_chars()).filter(pl.col("num_chars") >= min_chars)
    if job == "parquet":
        lf.sink_parquet(os.path.join(out_dir, "part-0.parquet"), compression="snappy", engine="streaming")
    elif plain:
        lf.sink_ndjson(os.path.join(out_dir, "part-0.jsonl"), engine="streaming")
    else:
        lf.sink_ndjson(os.path.join(out_dir, "part-0.jsonl.zst"), compression="zstd", compression_level=3,
                       check_extension=False, engine="streaming")


def _duckdb(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int, plain: bool, memory_limit: str = "") -> None:
    """DuckDB; with `memory_limit` (e.g. "512MiB") it spills to a temporary directory beside the output."""
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {cores}")
    spill = f"{out_dir}.duckdb-spill"
    if memory_limit:
        con.execute(f"SET memory_limit = '{memory_limit}'")
        con.execute(f"SET temp_directory = '{spill}'")
    files = "[" + ", ".join(f"'{p}'" for p in paths) + "]"
    scan = (f"read_json({files}, format='newline_delimited', "
            "columns={'id': 'VARCHAR', 'url': 'VARCHAR', 'text': 'VARCHAR'})")
    out = os.path.join(out_dir, "part-0.parquet" if job == "parquet" else "part-0.jsonl" if plain else "part-0.jsonl.zst")
    if job == "count":
        scan = scan.replace("'text': 'VARCHAR'}", "'text': 'VARCHAR', 'domain': 'VARCHAR'}")
    if job == "dedup":
        query = (f"SELECT id, url, text FROM (SELECT *, row_number() OVER () AS rn FROM {scan}) "
                 "QUALIFY row_number() OVER (PARTITION BY text ORDER BY rn) = 1")
    elif job == "count":
        query = f"SELECT domain, count(*) AS count FROM {scan} GROUP BY domain"
    else:
        query = f"SELECT *, length(text) AS num_chars FROM {scan} WHERE length(text) >= {min_chars}"
    options = "FORMAT parquet, COMPRESSION snappy" if job == "parquet" else "FORMAT json, COMPRESSION " + ("none" if plain else "zstd")
    try:
        con.execute(f"COPY ({query}) TO '{out}' ({options})")
    finally:
        con.close()
        shutil.rmtree(spill, ignore_errors=True)  # the spill directory DuckDB leaves behind


def _daft(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int, plain: bool) -> None:
    import daft
    from daft import col

    df = daft.read_json(list(paths))
    if job == "dedup":
        df = df.distinct("text")
    elif job == "count":
        df = df.groupby("domain").agg(col("url").count().alias("count"))
    else:
        df = df.with_column("num_chars", col("text").length()).where(col("num_chars") >= min_chars)
    if job == "parquet":
        df.write_parquet(out_dir, compression="snappy")
    else:
        df.write_json(out_dir)


def _peak_rss_mib() -> float:
    with open("/proc/self/status") as f:
        return round(next(int(line.split()[1]) for line in f if line.startswith("VmHWM:")) / 1024, 1)


if __name__ == "__main__":  # one peer in a fresh process (for Daft, in its own environment)
    spec = json.loads(sys.argv[1])
    result = runs_result(run_peer_runs(spec)) | {"peak_rss_mib": _peak_rss_mib(), "rss_note": "process"}
    print("RESULT " + json.dumps(result), flush=True)
