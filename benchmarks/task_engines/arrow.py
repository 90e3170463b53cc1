"""The jobs in pyarrow, as zephyr's batch path does them today: `pyarrow.json` parses,
`pyarrow.compute` and NumPy do the column work. pyarrow has no scalar hash kernel and no JSON
writer, so the hash is computed per value in Python (xxhash's XXH3-64, where zephyr uses
CRC-32 the same way) and parsed rows are written with orjson, one record at a time."""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.json as pj
import xxhash
from task_engines import NUM_PARTITIONS
from task_engines.arrow_io import open_output, read_runs, write_ipc, write_lines, write_sorted_partitions

__all__ = ["count_domains", "map_shard", "reduce_partition", "w1_filter"]

_READ = pj.ReadOptions(use_threads=False)


def _read(src: str) -> pa.Buffer:
    with pa.input_stream(src, compression="zstd") as f:
        return f.read_buffer()


def _parse(data: pa.Buffer, parse: pj.ParseOptions | None = None) -> pa.Table:
    return pj.read_json(pa.BufferReader(data), read_options=_READ, parse_options=parse or pj.ParseOptions())


def _lines(data: pa.Buffer) -> pa.Array:
    """The lines of `data` (which ends with a newline) as a string array, without newlines."""
    ends = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10) + 1
    offsets = pa.py_buffer(np.concatenate(([0], ends)).astype(np.int64))
    with_newline = pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(ends), [None, offsets, data])
    return pc.binary_slice(with_newline, 0, -1).cast(pa.large_string())


def _joined(lines: pa.Array) -> memoryview:
    """Every line followed by a newline, as one buffer."""
    if len(lines) == 0:
        return memoryview(b"")
    lines = lines.cast(pa.large_string())
    terminated = pc.binary_join_element_wise(lines, pa.scalar("", pa.large_string()), pa.scalar("\n", pa.large_string()))
    _, offsets, data = terminated.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64)[terminated.offset :][[0, len(terminated)]]
    return memoryview(data)[bounds[0] : bounds[1]]


def _json_lines(table: pa.Table) -> Iterator[bytes]:
    """The rows of `table` as JSON lines, orjson one record at a time (as zephyr writes them)."""
    for batch in table.to_batches(max_chunksize=8192):
        yield from (orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in batch.to_pylist())


def map_shard(src: str, out_dir: str, form: str) -> None:
    data = _read(src)
    table = _parse(data)
    n = table.num_rows
    text = table.column("text").cast(pa.large_binary()).to_pylist()
    hashes = np.fromiter(map(xxhash.xxh3_64_intdigest, text), dtype=np.uint64, count=n)
    del text
    pos = np.arange(n, dtype=np.int64)
    parts = (hashes % np.uint64(NUM_PARTITIONS)).astype(np.int32)
    order = np.lexsort((pos, hashes, parts))
    payload = {"line": _lines(data)} if form == "line" else {c: table.column(c) for c in ("id", "url", "text")}
    out = pa.table({"hash": hashes, "pos": pos, **payload, "part": parts}).take(order)
    write_sorted_partitions(out, out_dir)


def reduce_partition(runs: list[str], out: str, form: str) -> None:
    table = pa.concat_tables(read_runs(runs), promote_options="permissive").combine_chunks()
    hashes, shard, pos = (table.column(c).to_numpy() for c in ("hash", "shard", "pos"))
    order = np.lexsort((pos, shard, hashes))
    first = np.ones(len(order), dtype=bool)
    first[1:] = hashes[order][1:] != hashes[order][:-1]
    keep = order[first]
    keep = keep[np.lexsort((pos[keep], shard[keep]))]
    kept = table.take(keep)
    if form == "line":
        with open_output(out) as f:
            f.write(_joined(kept.column("line").combine_chunks()))
    else:
        write_lines(out, _json_lines(kept.select(["id", "url", "text"])))


def w1_filter(src: str, out: str, min_chars: int) -> None:
    table = _parse(_read(src))
    num_chars = pc.utf8_length(table.column("text")).cast(pa.int64())
    kept = table.append_column("num_chars", num_chars).filter(pc.greater_equal(num_chars, min_chars))
    with open(out, "wb") as f:
        for batch in kept.to_batches(max_chunksize=8192):
            f.write(b"".join(orjson.dumps(r, option=orjson.OPT_APPEND_NEWLINE) for r in batch.to_pylist()))


def count_domains(src: str, out: str) -> None:
    only_url = pj.ParseOptions(explicit_schema=pa.schema([("url", pa.string())]), unexpected_field_behavior="ignore")
    url = _parse(_read(src), only_url).column("url")
    domain = pc.list_element(pc.split_pattern(url, "/", max_splits=3), 2)
    counts = pa.table({"domain": domain}).group_by("domain").aggregate([("domain", "count")])
    counts = counts.rename_columns(["domain", "count"]).sort_by("domain")
    write_ipc(out, counts)
