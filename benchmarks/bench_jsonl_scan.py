"""The JSONL reader's scan for runs of 19+ digits (where orjson reads an integer beyond 64 bits
as a float, so the block is decoded again by `json`): zephyr's `_long_digits` (a NumPy sample
of every 9th byte, then an exact look where two samples are digits) against the plain scan it
replaced (`bytes.translate` every digit to "0", then a substring search) and a regex.

Input: W1's corpus (bench_ray_backend.py: 200-2,000-character documents), one shard,
decompressed and cut into 1 MiB blocks as the reader cuts them. One core, best of `--repeats`.

    uv run python benchmarks/bench_jsonl_scan.py --json benchmarks/results/jsonl_scan.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from bench_ray_backend import w1_corpus
from machine import machine, work_dir

_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_RUN = b"0" * 19
_REGEX = re.compile(rb"[0-9]{19}")


def translate_scan(block: bytes) -> bool:
    return _RUN in block.translate(_DIGITS_TO_ZERO)


def regex_scan(block: bytes) -> bool:
    return _REGEX.search(block) is not None


def blocks_of(path: str, size: int = 1 << 20) -> list[bytes]:
    from zephyr.io import open_input

    with open_input(path) as f:
        data = f.read()
    out, i = [], 0
    while i < len(data):
        j = data.find(b"\n", i + size)
        j = len(data) if j < 0 else j + 1
        out.append(data[i:j])
        i = j
    return out


def best_ms_per_mb(scan, blocks: list[bytes], repeats: int) -> tuple[float, int]:
    total = sum(map(len, blocks))
    best, hits = float("inf"), 0
    for _ in range(repeats):
        start = time.perf_counter()
        hits = sum(map(scan, blocks))
        best = min(best, time.perf_counter() - start)
    return best * 1e3 / (total / 1e6), hits


def main(argv=None) -> dict:
    from zephyr.io.jsonl import _long_digits

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--docs", type=int, default=50_000, help="documents in the shard (default 50,000)")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--work-dir", default=None)
    parser.add_argument("--json", default=None)
    args = parser.parse_args(argv)
    with work_dir(args.work_dir, "zephyr-bench-scan-") as work:
        info = w1_corpus(os.path.join(work, "w1"), 1, args.docs)
        blocks = blocks_of(info.paths[0])
    results = {}
    for name, scan in (("zephyr _long_digits", _long_digits), ("translate + find (before)", translate_scan), ("regex", regex_scan)):
        ms, hits = best_ms_per_mb(scan, blocks, args.repeats)
        results[name] = {"ms_per_mb": round(ms, 3), "blocks_with_a_run": hits}
    hits = {r["blocks_with_a_run"] for r in results.values()}
    assert len(hits) == 1, results  # every scan finds the same blocks
    result = {"benchmark": "jsonl_scan", "machine": machine(), "blocks": len(blocks),
              "mb": round(sum(map(len, blocks)) / 1e6, 1), "scans": results}
    print(f"\n{len(blocks)} blocks, {result['mb']} MB\n\n| scan | ms per MB | blocks with a run |\n|---|---|---|")
    for name, r in results.items():
        print(f"| {name} | {r['ms_per_mb']} | {r['blocks_with_a_run']} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)
    return result


if __name__ == "__main__":
    main()
