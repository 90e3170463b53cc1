"""The two jobs of `bench_columnar.py` in Polars, DuckDB and Daft, each on all cores.

- dedup: read the JSONL.zst corpus, keep the first document per `text`, write JSON lines;
- w1: read, add `num_chars` (characters of `text`), keep documents with at least `min_chars`,
  write JSON lines.

Polars holds the whole corpus in memory (`read_ndjson` of each decompressed file, then one
frame) and its output is zstd-compressed (level 3, all cores) by `zstandard`; DuckDB reads
and writes `.jsonl.zst` itself (`COPY ... (FORMAT json, COMPRESSION zstd)`); Daft reads the
files itself and writes uncompressed JSON (its `write_json` has no compression option). Keep-
first order: Polars `unique(keep="first", maintain_order=True)`; DuckDB the first row of each
text by scan order (`row_number() OVER ()`); Daft `distinct("text")`, which does not say which
row of a group it keeps (so its kept ids may differ; the count must match).

Installed by the bench group only: `uv run --group bench python benchmarks/bench_columnar.py`.
"""

from __future__ import annotations

import os

__all__ = ["PEERS", "run_peer"]

PEERS = ("polars", "duckdb", "daft")


def run_peer(name: str, job: str, paths: list[str], out_dir: str, cores: int, min_chars: int) -> None:
    os.makedirs(out_dir, exist_ok=True)
    {"polars": _polars, "duckdb": _duckdb, "daft": _daft}[name](job, paths, out_dir, cores, min_chars)


def _polars(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int) -> None:
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
    else:
        df = df.with_columns(num_chars=pl.col("text").str.len_chars()).filter(pl.col("num_chars") >= min_chars)
    buffer = io.BytesIO()
    df.write_ndjson(buffer)
    with open(os.path.join(out_dir, "part-0.jsonl.zst"), "wb") as f:
        f.write(zstandard.ZstdCompressor(level=3, threads=cores).compress(buffer.getvalue()))


def _duckdb(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int) -> None:
    import duckdb

    con = duckdb.connect()
    con.execute(f"SET threads = {cores}")
    files = "[" + ", ".join(f"'{p}'" for p in paths) + "]"
    scan = (f"read_json({files}, format='newline_delimited', "
            "columns={'id': 'VARCHAR', 'url': 'VARCHAR', 'text': 'VARCHAR'})")
    out = os.path.join(out_dir, "part-0.jsonl.zst")
    if job == "dedup":
        query = (f"SELECT id, url, text FROM (SELECT *, row_number() OVER () AS rn FROM {scan}) "
                 "QUALIFY row_number() OVER (PARTITION BY text ORDER BY rn) = 1")
    else:
        query = f"SELECT *, length(text) AS num_chars FROM {scan} WHERE length(text) >= {min_chars}"
    con.execute(f"COPY ({query}) TO '{out}' (FORMAT json, COMPRESSION zstd)")


def _daft(job: str, paths: list[str], out_dir: str, cores: int, min_chars: int) -> None:
    import daft
    from daft import col

    df = daft.read_json(list(paths))
    if job == "dedup":
        df = df.distinct("text")
    else:
        df = df.with_column("num_chars", col("text").length()).where(col("num_chars") >= min_chars)
    df.write_json(out_dir)
