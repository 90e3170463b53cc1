"""The jobs in DuckDB (`SET threads = 1`), as SQL over its own JSON reader.

The hash is DuckDB's `hash()` (64 bits, unsigned). The `line` form reads the raw lines with
`read_ndjson_objects` (its `json` column) and takes `text` with `->>`. DuckDB has no Arrow IPC
reader or writer built in: the map's sorted result comes out as Arrow and pyarrow writes the
runs; the reduce's runs are read by pyarrow and scanned by DuckDB in place."""

from __future__ import annotations

import duckdb
import pyarrow as pa
from task_engines import NUM_PARTITIONS
from task_engines.arrow_io import read_runs, write_ipc, write_sorted_partitions

__all__ = ["count_domains", "map_shard", "reduce_partition", "w1_filter"]

_KEEP_FIRST = "QUALIFY row_number() OVER (PARTITION BY hash ORDER BY shard, pos) = 1 ORDER BY shard, pos"


def _connect() -> duckdb.DuckDBPyConnection:
    con = duckdb.connect()
    con.execute("SET threads = 1")
    return con


def _json(src: str) -> str:
    return f"read_json('{src}', format = 'newline_delimited', compression = 'zstd')"


def _copy(con: duckdb.DuckDBPyConnection, query: str, out: str, fmt: str) -> None:
    compression = "zstd" if out.endswith(".zst") else "none"
    if fmt == "lines":  # one column, never quoted: the delimiter and quote are bytes JSON never holds raw
        options = "FORMAT csv, HEADER false, QUOTE '', ESCAPE '', DELIMITER '\x01'"
    else:
        options = "FORMAT json"
    con.execute(f"COPY ({query}) TO '{out}' ({options}, COMPRESSION {compression})")


def map_shard(src: str, out_dir: str, form: str) -> None:
    if form == "columns":
        rows = f"SELECT hash(text) AS hash, row_number() OVER () - 1 AS pos, id, url, text FROM {_json(src)}"
        payload = "id, url, text"
    else:
        rows = (f"SELECT hash(json->>'$.text') AS hash, row_number() OVER () - 1 AS pos, json::VARCHAR AS line "
                f"FROM read_ndjson_objects('{src}', compression = 'zstd')")
        payload = "line"
    query = (f"SELECT hash, pos, {payload}, (hash % {NUM_PARTITIONS})::INTEGER AS part FROM ({rows}) "
             "ORDER BY part, hash, pos")
    con = _connect()
    write_sorted_partitions(con.sql(query).to_arrow_table(), out_dir)


def reduce_partition(runs: list[str], out: str, form: str) -> None:
    con = _connect()
    con.register("runs", pa.concat_tables(read_runs(runs), promote_options="permissive"))
    columns = "line" if form == "line" else "id, url, text"
    _copy(con, f"SELECT {columns} FROM runs {_KEEP_FIRST}", out, "lines" if form == "line" else "json")


def w1_filter(src: str, out: str, min_chars: int) -> None:
    query = f"SELECT *, length(text) AS num_chars FROM {_json(src)} WHERE length(text) >= {min_chars}"
    _copy(_connect(), query, out, "json")


def count_domains(src: str, out: str) -> None:
    query = (f"SELECT split_part(url, '/', 3) AS domain, count(*)::BIGINT AS count FROM {_json(src)} "
             "GROUP BY domain ORDER BY domain")
    write_ipc(out, _connect().sql(query).to_arrow_table())
