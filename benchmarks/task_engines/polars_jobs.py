"""The jobs in Polars, eager (`DataFrame` methods, each run at once) or lazy (one `LazyFrame`
query run by the streaming engine: `collect(engine="streaming")` or a streaming sink).
The driver sets POLARS_MAX_THREADS=1 before Polars is imported.

The hash is Polars' `Expr.hash(seed=0)` (64 bits; Polars documents it as not stable across
versions). The `line` form reads lines with `scan_lines`/`read_lines` and gets `text` with
`str.json_decode` (the whole document, to a struct); `line-path` with `str.json_path_match`."""

from __future__ import annotations

import os

import polars as pl
from task_engines import NUM_PARTITIONS, ZSTD_LEVEL, run_path

__all__ = ["count_domains", "map_shard", "reduce_partition", "w1_filter"]

_DOC = pl.Struct({"id": pl.String, "url": pl.String, "text": pl.String})
_COLUMNS = ["id", "url", "text"]


def _scan_json(src: str, lazy: bool, **kwargs):
    return pl.scan_ndjson(src, **kwargs) if lazy else pl.read_ndjson(src, **kwargs)


def _collect(frame, lazy: bool) -> pl.DataFrame:
    return frame.collect(engine="streaming") if lazy else frame


def _compression(out: str) -> dict:
    if out.endswith(".zst"):
        return {"compression": "zstd", "compression_level": ZSTD_LEVEL, "check_extension": False}
    return {"check_extension": False}


def map_shard(src: str, out_dir: str, form: str, lazy: bool) -> None:
    os.makedirs(out_dir, exist_ok=True)
    if form == "columns":
        frame, text, payload = _scan_json(src, lazy, row_index_name="pos"), pl.col("text"), _COLUMNS
    else:
        frame = pl.scan_lines(src, row_index_name="pos") if lazy else pl.read_lines(src, row_index_name="pos")
        payload = ["line"]
        if form == "line":
            text = pl.col("line").str.json_decode(_DOC).struct.field("text")
        else:
            text = pl.col("line").str.json_path_match("$.text")
    frame = frame.select(text.hash(seed=0).alias("hash"), pl.col("pos").cast(pl.Int64), *payload)
    frame = frame.with_columns(part=(pl.col("hash") % NUM_PARTITIONS).cast(pl.Int32)).sort(["hash", "pos"])
    pieces = _collect(frame, lazy).partition_by("part", as_dict=True, include_key=False, maintain_order=True)
    empty = pl.DataFrame(schema={k: v for k, v in frame.collect_schema().items() if k != "part"})
    for p in range(NUM_PARTITIONS):
        pieces.get((p,), empty).write_ipc_stream(run_path(out_dir, p))


def reduce_partition(runs: list[str], out: str, form: str, lazy: bool) -> None:
    frames = [pl.read_ipc_stream(path).with_columns(shard=pl.lit(s, pl.Int32)) for s, path in enumerate(runs)]
    frame = pl.concat([f.lazy() for f in frames]) if lazy else pl.concat(frames)
    # runs in shard order, each sorted by (hash, pos): the first row of a hash is its first by (shard, pos)
    kept = frame.unique(subset="hash", keep="first", maintain_order=True).sort(["shard", "pos"])
    if form == "columns":
        kept = kept.select(_COLUMNS)
        if lazy:
            kept.sink_ndjson(out, engine="streaming", **_compression(out))
        else:
            kept.write_ndjson(out, **_compression(out))
        return
    kept = kept.select("line")
    options = {"include_header": False, "quote_style": "never", **_compression(out)}
    if lazy:
        kept.sink_csv(out, engine="streaming", **options)
    else:
        kept.write_csv(out, **options)


def w1_filter(src: str, out: str, min_chars: int, lazy: bool) -> None:
    frame = _scan_json(src, lazy).with_columns(num_chars=pl.col("text").str.len_chars())
    frame = frame.filter(pl.col("num_chars") >= min_chars)
    if lazy:
        frame.sink_ndjson(out, engine="streaming")
    else:
        frame.write_ndjson(out)


def count_domains(src: str, out: str, lazy: bool) -> None:
    domain = pl.col("url").str.splitn("/", 4).struct.field("field_2").alias("domain")
    frame = _scan_json(src, lazy).group_by(domain).agg(pl.len().cast(pl.Int64).alias("count")).sort("domain")
    _collect(frame, lazy).write_ipc_stream(out)
