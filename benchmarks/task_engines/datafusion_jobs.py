"""The jobs in DataFusion (`target_partitions = 1`), through its DataFrame API and SQL.

DataFusion has no 64-bit hash in its core functions; its Spark functions have `xxhash64`
(Spark's XXH64 with seed 42, a signed Int64), used here, the partition `pmod(hash, 8)`. It has
no line reader and no JSON functions in its core: the `line` form reads lines with its CSV
reader (delimiter and quote set to bytes a JSON line never holds raw, one column) and takes
`text` with the Spark `json_tuple`. Arrow IPC goes through pyarrow as for DuckDB."""

from __future__ import annotations

import datafusion.functions as F
import pyarrow as pa
from datafusion import CsvReadOptions, SessionConfig, SessionContext, col, lit
from task_engines import NUM_PARTITIONS
from task_engines.arrow_io import read_runs, write_ipc, write_sorted_partitions

__all__ = ["count_domains", "map_shard", "reduce_partition", "w1_filter"]

_ZST = {"file_extension": ".zst", "file_compression_type": "zstd"}
_KEEP_FIRST = "QUALIFY row_number() OVER (PARTITION BY hash ORDER BY shard, pos) = 1 ORDER BY shard, pos"


def _context() -> SessionContext:
    return SessionContext(SessionConfig().with_target_partitions(1))


def _lines(ctx: SessionContext, src: str):
    options = CsvReadOptions(has_header=False, delimiter="\x01", quote="\x02", schema=pa.schema([("line", pa.string())]), **_ZST)
    return ctx.read_csv(src, options=options)


def _copy(ctx: SessionContext, query: str, out: str, fmt: str) -> None:
    options = {"format.compression": "zstd" if out.endswith(".zst") else "uncompressed"}
    if fmt == "lines":  # one column, never quoted (see the module's docstring)
        options |= {"format.has_header": "false", "format.delimiter": "\x01", "format.quote": "\x02"}
    rendered = ", ".join(f"'{k}' '{v}'" for k, v in options.items())
    ctx.sql(f"COPY ({query}) TO '{out}' STORED AS {'CSV' if fmt == 'lines' else 'JSON'} OPTIONS ({rendered})").collect()


def map_shard(src: str, out_dir: str, form: str) -> None:
    ctx = _context()
    if form == "columns":
        frame, text, payload = ctx.read_json(src, **_ZST), col("text"), ["id", "url", "text"]
    else:
        frame, payload = _lines(ctx, src), ["line"]
        text = F.get_field(F.spark.json_tuple(col("line"), lit("text")), "c0")
    frame = frame.select(F.spark.xxhash64(text).alias("hash"), (F.row_number() - lit(1)).cast(pa.int64()).alias("pos"),
                         *(col(c) for c in payload))
    frame = frame.with_column("part", F.spark.pmod(col("hash"), lit(NUM_PARTITIONS)).cast(pa.int32()))
    frame = frame.sort(col("part").sort(), col("hash").sort(), col("pos").sort())
    write_sorted_partitions(frame.to_arrow_table(), out_dir)


def reduce_partition(runs: list[str], out: str, form: str) -> None:
    ctx = _context()
    ctx.register_record_batches("runs", [pa.concat_tables(read_runs(runs), promote_options="permissive").to_batches()])
    columns = "line" if form == "line" else "id, url, text"
    _copy(ctx, f"SELECT {columns} FROM runs {_KEEP_FIRST}", out, "lines" if form == "line" else "json")


def w1_filter(src: str, out: str, min_chars: int) -> None:
    ctx = _context()
    frame = ctx.read_json(src, **_ZST).with_column("num_chars", F.character_length(col("text")))
    ctx.register_table("w1", frame.filter(col("num_chars") >= lit(min_chars)).into_view())
    _copy(ctx, "SELECT * FROM w1", out, "json")


def count_domains(src: str, out: str) -> None:
    ctx = _context()
    frame = ctx.read_json(src, **_ZST).select(F.split_part(col("url"), lit("/"), lit(3)).alias("domain"))
    frame = frame.aggregate([col("domain")], [F.count_star().cast(pa.int64()).alias("count")]).sort(col("domain").sort())
    write_ipc(out, frame.to_arrow_table())
