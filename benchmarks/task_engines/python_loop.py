"""The baseline: a hand-written Python loop, one record at a time (orjson, zstandard, xxhash's
XXH3-64 of the UTF-8 text); pyarrow only to write and read the IPC runs."""

from __future__ import annotations

import io
import os
from collections import Counter

import orjson
import pyarrow as pa
import xxhash
import zstandard
from task_engines import NUM_PARTITIONS, run_path
from task_engines.arrow_io import write_ipc, write_lines

__all__ = ["count_domains", "map_shard", "reduce_partition", "w1_filter"]

_COLUMNS = ("id", "url", "text")


def _lines(src: str):
    """The lines of a .jsonl.zst file, without their newline."""
    with open(src, "rb") as raw:
        reader = io.BufferedReader(zstandard.ZstdDecompressor().stream_reader(raw), buffer_size=1 << 20)
        for line in reader:
            yield line.rstrip(b"\n")


def map_shard(src: str, out_dir: str, form: str) -> None:
    os.makedirs(out_dir, exist_ok=True)
    parts: list[list[tuple]] = [[] for _ in range(NUM_PARTITIONS)]
    for pos, line in enumerate(_lines(src)):
        doc = orjson.loads(line)
        h = xxhash.xxh3_64_intdigest(doc["text"].encode())
        row = (h, pos, line) if form == "line" else (h, pos, doc["id"], doc["url"], doc["text"])
        parts[h % NUM_PARTITIONS].append(row)
    names = ("hash", "pos", "line") if form == "line" else ("hash", "pos", *_COLUMNS)
    types = (pa.uint64(), pa.int64()) + (pa.string(),) * (len(names) - 2)
    schema = pa.schema(list(zip(names, types)))
    for p, rows in enumerate(parts):
        rows.sort()  # by (hash, pos): positions are unique, so nothing after them is compared
        columns = list(zip(*rows)) if rows else [()] * len(names)
        write_ipc(run_path(out_dir, p), pa.table([pa.array(c, t) for c, t in zip(columns, types)], schema=schema))


def reduce_partition(runs: list[str], out: str, form: str) -> None:
    seen: dict[int, tuple] = {}
    for shard, path in enumerate(runs):
        with pa.OSFile(path, "rb") as f:
            table = pa.ipc.open_stream(f).read_all()
        payload = ("line",) if form == "line" else _COLUMNS
        columns = [table.column(name).to_pylist() for name in ("hash", "pos", *payload)]
        for h, pos, *values in zip(*columns):
            if h not in seen:  # runs come in shard order, each sorted by (hash, pos): the first seen is the first
                seen[h] = (shard, pos, values)
    kept = sorted(seen.values(), key=lambda row: (row[0], row[1]))
    if form == "line":
        write_lines(out, (values[0].encode() + b"\n" for _, _, values in kept))
    else:
        write_lines(out, (orjson.dumps(dict(zip(_COLUMNS, values)), option=orjson.OPT_APPEND_NEWLINE) for _, _, values in kept))


def w1_filter(src: str, out: str, min_chars: int) -> None:
    with open(out, "wb") as f:
        for line in _lines(src):
            doc = orjson.loads(line)
            n = len(doc["text"])
            if n >= min_chars:
                doc["num_chars"] = n
                f.write(orjson.dumps(doc, option=orjson.OPT_APPEND_NEWLINE))


def count_domains(src: str, out: str) -> None:
    counts = Counter(orjson.loads(line)["url"].split("/", 3)[2] for line in _lines(src))
    domains = sorted(counts)
    write_ipc(out, pa.table({"domain": pa.array(domains, pa.string()), "count": pa.array([counts[d] for d in domains], pa.int64())}))
