"""What identifying a plan's work costs when planning (issue 21, 2): microseconds per plan.

A typical plan: 200 input files, load_jsonl, a map calling a module-level helper that reads
constants, a filter on a 200-word stop set held by a callable object, a group_by with key,
sort_by and reducer, a map and a JSONL writer. Reported: `compile_plan` in all and the part of
it spent in `fingerprint.identify` (timed around each call), and the same for a from_list
source of 1,000 dict records; and a plan whose function
comes from a package of the user's own (marin's tokenize step over the 200 files: the code it
reaches is 4 of marin's modules and the `tokenizers` distribution, issue 38, 4). "first plan" is
the first `compile_plan` of each plan in the process (files read and parsed, distributions
looked up); min and median are of the 30 plans that follow. All are CPU (process) time.

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


def user_package(root: str) -> Dataset:
    from marin.tokenize import tokenize_dataset

    return tokenize_dataset(Dataset.from_files(f"{root}/*.jsonl").load_file(), f"{root}/tokens")


def timed_plans(ds: Dataset, repeats: int = 30) -> tuple[list[float], list[float]]:
    """CPU time (process time, so a loaded machine's waits do not count) of `compile_plan(ds)`
    and of the `identify` calls inside it, per plan, in microseconds."""
    real = plan_module.identify
    spent = [0.0]

    def identify(*parts, after=None):
        t = time.process_time()
        try:
            return real(*parts, after=after)
        finally:
            spent[0] += time.process_time() - t

    plan_module.identify = identify
    totals, identifies = [], []
    try:
        for _ in range(repeats):
            spent[0] = 0.0
            t = time.process_time()
            plan_module.compile_plan(ds)
            totals.append((time.process_time() - t) * 1e6)
            identifies.append(spent[0] * 1e6)
    finally:
        plan_module.identify = real
    return totals, identifies


def _min_median(values: list[float]) -> list[int]:
    return [round(min(values)), round(statistics.median(values))]


def main() -> None:
    with tempfile.TemporaryDirectory() as root:
        for i in range(200):
            Path(root, f"in-{i:03d}.jsonl").write_text('{"text": "a b c"}\n')
        results = {}
        cases = (("typical (200 files)", lambda: typical(root)), ("from_list (1,000 records)", from_list),
                 ("user package (marin.tokenize, 200 files)", lambda: user_package(root)))
        for name, make in cases:
            ds = make()
            (first_total,), (first_identify,) = timed_plans(ds, repeats=1)
            totals, identifies = timed_plans(ds)
            results[name] = {"first plan: compile_plan_us, identify_us": [round(first_total), round(first_identify)],
                             "compile_plan_us (min, median)": _min_median(totals),
                             "identify_us (min, median)": _min_median(identifies),
                             "stages": len(plan_module.compile_plan(ds).stages)}
        print(json.dumps(results, indent=2))


if __name__ == "__main__":
    main()
