"""The oracle for `bench_task_engines.py`: what each job must produce, worked out in plain
Python (stdlib `json`, `urllib.parse`) apart from every engine, and the checks of an output
against it. Nothing here is timed.

- map: the 8 runs together hold every row of the shard once, at its position (its line, or its
  id/url/text, equal to the input's); each run is sorted by (hash, position); one text has one
  hash and one hash one text (no collision), and a hash lies in one run only.
- reduce: the output's lines, in order, are the input lines of the first document of each
  distinct text (by shard, then position) among the partition's rows: byte for byte, or
  else equal as parsed records.
- W1: the output parses to the input documents with >= min_chars characters, in order, each
  with `num_chars` added.
- count: (domain, count) equal to a count of each url's host.
"""

from __future__ import annotations

import collections
import hashlib
import json
import urllib.parse

import numpy as np
import pyarrow as pa
import zstandard

__all__ = ["check_count", "check_map", "check_records", "check_reduce", "expected_count", "expected_reduce",
           "expected_w1", "read_lines"]


def read_lines(path: str) -> list[bytes]:
    """The lines of a JSON-lines file (`.zst` or plain), without newlines."""
    with open(path, "rb") as f:
        data = zstandard.ZstdDecompressor().stream_reader(f).read() if path.endswith(".zst") else f.read()
    lines = data.split(b"\n")
    if lines and lines[-1] == b"":
        lines.pop()
    return lines


def _read_ipc(path: str) -> pa.Table:
    with pa.OSFile(path, "rb") as f:
        return pa.ipc.open_stream(f).read_all()


def _sha(lines: list[bytes]) -> str:
    return hashlib.sha256(b"\n".join(lines)).hexdigest()[:16]


# ---- map ---------------------------------------------------------------------------------------------


def check_map(run_paths: list[str], lines: list[bytes], docs: list[dict], form: str) -> dict:
    """Check one shard's runs against its input lines (and those parsed); {"rows", "ok", "problems"}."""
    problems: list[str] = []
    seen = np.zeros(len(lines), dtype=bool)
    hash_of_text: dict[str, object] = {}
    text_of_hash: dict[object, str] = {}
    run_of_hash: dict[object, int] = {}
    rows = 0
    for p, path in enumerate(run_paths):
        table = _read_ipc(path)
        rows += table.num_rows
        hashes, pos = table.column("hash").to_pylist(), table.column("pos").to_pylist()
        if list(zip(hashes, pos)) != sorted(zip(hashes, pos)):
            problems.append(f"run {p} not sorted by (hash, pos)")
        payload = table.column("line").to_pylist() if form.startswith("line") else table.column("id").to_pylist()
        for h, i, value in zip(hashes, pos, payload):
            if seen[i]:
                problems.append(f"position {i} twice")
            seen[i] = True
            want = lines[i].decode() if form.startswith("line") else docs[i]["id"]
            if value != want:
                problems.append(f"run {p}, position {i}: {value[:60]!r} is not the input's {want[:60]!r}")
            text = docs[i]["text"]
            if hash_of_text.setdefault(text, h) != h:
                problems.append(f"position {i}: one text, two hashes")
            if text_of_hash.setdefault(h, text) != text:
                problems.append(f"position {i}: hash collision")
            if run_of_hash.setdefault(h, p) != p:
                problems.append(f"hash {h} in runs {run_of_hash[h]} and {p}")
    if not seen.all():
        problems.append(f"{int((~seen).sum())} positions missing")
    return {"rows": rows, "ok": not problems, "problems": problems[:5]}


# ---- reduce ------------------------------------------------------------------------------------------


def expected_reduce(column_runs: list[str], shard_paths: list[str]) -> list[bytes]:
    """The input lines the reduce of these runs (one per shard, columns form) must keep, in order."""
    first: dict[str, tuple[int, int]] = {}
    for shard, path in enumerate(column_runs):
        table = _read_ipc(path)
        for pos, text in sorted(zip(table.column("pos").to_pylist(), table.column("text").to_pylist())):
            first.setdefault(text, (shard, pos))
    wanted = collections.defaultdict(list)
    for shard, pos in sorted(first.values()):
        wanted[shard].append(pos)
    kept: list[bytes] = []
    for shard, positions in sorted(wanted.items()):
        lines = read_lines(shard_paths[shard])
        kept.extend(lines[p] for p in positions)
    return kept


def check_reduce(out: str, expected: list[bytes]) -> dict:
    got = read_lines(out)
    result = {"rows": len(got), "bytes_equal": got == expected, "sha": _sha(got)}
    result["ok"] = result["bytes_equal"] or [json.loads(x) for x in got] == [json.loads(x) for x in expected]
    return result


# ---- W1 and the count ---------------------------------------------------------------------------------


def expected_w1(src: str, min_chars: int) -> list[dict]:
    docs = (json.loads(line) for line in read_lines(src))
    return [doc | {"num_chars": len(doc["text"])} for doc in docs if len(doc["text"]) >= min_chars]


def check_records(out: str, expected: list[dict]) -> dict:
    got = read_lines(out)
    records = [json.loads(line) for line in got]
    same_ids = [r.get("id") for r in records] == [r["id"] for r in expected]
    return {"rows": len(got), "ok": records == expected, "ids_equal": same_ids, "sha": _sha(got)}


def expected_count(src: str) -> dict[str, int]:
    return dict(collections.Counter(urllib.parse.urlsplit(json.loads(line)["url"]).netloc for line in read_lines(src)))


def check_count(out: str, expected: dict[str, int]) -> dict:
    table = _read_ipc(out)
    got = dict(zip(table.column("domain").to_pylist(), table.column("count").to_pylist()))
    domains = table.column("domain").to_pylist()
    return {"rows": table.num_rows, "ok": got == expected and domains == sorted(domains)}
