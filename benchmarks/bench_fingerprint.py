"""What identifying a plan's work costs when planning (issue 21, 2): microseconds per plan.

A typical plan: 200 input files, load_jsonl, a map calling a module-level helper that reads
constants, a filter on a 200-word stop set held by a callable object, a group_by with key,
sort_by and reducer, a map and a JSONL writer. Reported: `compile_plan` in all, the part of it
spent in `fingerprint.identify` (planning with identify stubbed out, subtracted), and the
same identity walk for a from_list source of 1,000 dict records.

    uv run python benchmarks/bench_fingerprint.py
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from zephyr import Dataset
from zephyr.plan import compile as plan_module
from zephyr.plan.fingerprint import Identity

MIN_LEN = 3
LOWER = True
STOP = [f"w{i}" for i in range(200)]


def normalize(record):
    text = record["text"].lower() if LOWER else record["text"]
    return {**record, "text": text, "n": len(text.split())}


class StopFilter:
    def __init__(self, words):
        self.words = set(words)

    def __call__(self, record):
        return record["n"] >= MIN_LEN and record["text"] not in self.words


def count(key, items):
    return {"key": key, "n": sum(1 for _ in items)}


def typical(root: str) -> Dataset:
    return (Dataset.from_files(f"{root}/*.jsonl").load_jsonl().map(lambda r: normalize(r)).filter(StopFilter(STOP))
            .group_by(lambda r: r["text"][:2], count, sort_by=lambda r: r["n"], num_output_shards=16)
            .map(lambda r: {**r, "ok": True}).write_jsonl(f"{root}/out/part-{{shard:05d}}.jsonl"))


def from_list() -> Dataset:
    items = [{"id": i, "text": f"document {i}", "tags": ["a", "b"], "score": i / 7} for i in range(1000)]
    return Dataset.from_list(items).map(lambda r: normalize(r)).deduplicate(lambda r: r["text"]).write_jsonl("/tmp/x/p-{shard}.jsonl")


def best_us(fn, repeats: int = 30) -> float:
    times = []
    for _ in range(repeats):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times) * 1e6, statistics.median(times) * 1e6


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        for i in range(200):
            Path(root, f"in-{i:03d}.jsonl").write_text('{"text": "a b c"}\n')
        results = {}
        for name, make in (("typical (200 files)", lambda: typical(root)), ("from_list (1,000 records)", from_list)):
            ds = make()
            real = plan_module.identify
            total = best_us(lambda: plan_module.compile_plan(ds))
            plan_module.identify = lambda *parts, after=None: Identity("0")
            try:
                without = best_us(lambda: plan_module.compile_plan(ds))
            finally:
                plan_module.identify = real
            results[name] = {"compile_plan_us (min, median)": [round(x) for x in total],
                             "identify_us (min, median)": [round(a - b) for a, b in zip(total, without)],
                             "stages": len(plan_module.compile_plan(ds).stages)}
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
