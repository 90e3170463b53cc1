"""CPU seconds per stage of bench_columnar.py's exact dedup, in one process (issue 39).

Runs `load_jsonl().deduplicate(col("text")).write_jsonl(...)` on the sync backend (every task
in this process, `--memory` per task as the Ray benchmark gives it) and charges the process's
CPU time to the innermost stage function running (each function below is wrapped; a
generator's time is charged per step), so the stages add up to the total:

    uv run --group bench python benchmarks/profile_dedup_stages.py --docs 500000

The functions wrapped are zephyr internals: rename them here when they move.
"""

from __future__ import annotations

import argparse
import collections
import functools
import inspect
import os
import shutil
import sys
import tempfile
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import ensure_corpus

_exclusive: collections.Counter = collections.Counter()
_stack: list[list] = []


def _enter(label: str) -> None:
    now = time.process_time()
    if _stack:
        _exclusive[_stack[-1][0]] += now - _stack[-1][1]
    _stack.append([label, now])


def _leave() -> None:
    now = time.process_time()
    label, start = _stack.pop()
    _exclusive[label] += now - start
    if _stack:
        _stack[-1][1] = now


def _wrap(owner, name: str, label: str) -> None:
    f = getattr(owner, name, None) if owner is not None else None
    if f is None:  # a stage an older checkout lacks (profiled for a before/after)
        return
    if inspect.isgeneratorfunction(f):
        @functools.wraps(f)
        def wrapped(*args, **kwargs):
            steps = f(*args, **kwargs)
            while True:
                _enter(label)
                try:
                    item = next(steps)
                except StopIteration:
                    return
                finally:
                    _leave()
                yield item
    else:
        @functools.wraps(f)
        def wrapped(*args, **kwargs):
            _enter(label)
            try:
                return f(*args, **kwargs)
            finally:
                _leave()
    setattr(owner, name, wrapped)


def _instrument() -> None:
    from zephyr.engine import scan
    from zephyr.execution import engine_ops, shard
    from zephyr.shuffle import merge, reduce, runs, scatter, slices

    try:
        from zephyr.shuffle import run_keys  # runs without key bytes (an older checkout has none)
    except ImportError:
        run_keys = None

    for owner, name, label in [
        (scan, "jsonl_blocks", "map: read + decompress"), (scan, "decode_block_lines", "map: orjson parse"),
        (scan, "_frame_of_records", "map: key column to Polars"),
        (scan, "read_columns", "map: native column scan"), (scan, "_lines_of_block", "map: line array"),
        (engine_ops, "jsonl_frames", "map: scan other"), (scatter, "frame_keys", "map: key bytes + hash"),
        (scatter._Buffer, "_assembled", "map: assemble batch"), (scatter._Buffer, "_spill_arrow", "map: spill (concat, take)"),
        (scatter, "sort_order", "map: sort"), (scatter, "group_starts", "map: keep-first combine"),
        (runs.ArrowRunWriter, "write", "map: IPC write"), (scatter.ScatterSink, "write", "map: other"),
        (reduce._ColumnarMerge, "_source", "reduce: IPC read"), (merge, "sort_order", "reduce: sort"),
        (slices, "sort_order", "reduce: sort"), (merge.Chunk, "sorted", "reduce: sort"),
        (merge, "merge_sorted", "reduce: merge (batch per round)"),
        (reduce, "merge_slices", "reduce: merge (slices)"), (merge, "_first_slices", "reduce: keep-first + take"),
        (run_keys, "_key_values", "reduce: keys read back from the payload"),
        (shard, "write_jsonl_file", "write: JSON lines"),
    ]:
        _wrap(owner, name, label)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=500_000)
    parser.add_argument("--shards", type=int, default=8)
    parser.add_argument("--memory", default="256MiB")
    parser.add_argument("--corpus", default=None, help="corpus directory (default: under the temp dir, kept)")
    parser.add_argument("--out", default=None, help="keep the dedup's output files here (to compare runs)")
    parser.add_argument("--dup-fraction", type=float, default=0.1, help="exact duplicates among the docs (bench_columnar.py's: 0.1)")
    args = parser.parse_args()
    suffix = "" if args.dup_fraction == 0.1 else f"-dup{args.dup_fraction:g}"
    corpus = args.corpus or os.path.join(tempfile.gettempdir(), f"zephyr-dedup-corpus-{args.docs}{suffix}")
    info = ensure_corpus(corpus, num_shards=args.shards, docs_per_shard=args.docs // args.shards,
                         dup_fraction=args.dup_fraction, min_chars=50, max_chars=400, seed=4)  # bench_columnar.py's corpus at 0.1
    import pandas  # noqa: F401  pyarrow imports it on first use: not a stage's cost
    from zephyr import Dataset, col, create_backend

    _instrument()
    work = tempfile.mkdtemp(prefix="zephyr-profile-")
    try:
        backend = create_backend("sync", memory=args.memory, progress=False, scratch_dir=os.path.join(work, "scratch"))
        ds = (Dataset.from_files(list(info.paths)).load_jsonl().deduplicate(col("text"))
              .write_jsonl(os.path.join(args.out or os.path.join(work, "out"), "part-{shard:05d}.jsonl")))
        start, wall = time.process_time(), time.perf_counter()
        _enter("driver, other")
        execution = backend.execute(ds)
        list(execution)
        _leave()
        total = time.process_time() - start
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"{args.docs:,} docs: {total:.2f} CPU s ({time.perf_counter() - wall:.1f} s wall); "
          f"slices {execution.counters.get('zephyr/shuffle_slices', 0)}; "
          f"spill {execution.counters.get('zephyr/shuffle_bytes_written', 0):,} bytes")
    for stage in ("map", "reduce"):
        seconds = sum(v for k, v in _exclusive.items() if k.startswith(stage + ":"))
        print(f"{stage} stages: {seconds:.2f} CPU s")
    for label, seconds in sorted(_exclusive.items(), key=lambda kv: -kv[1]):
        print(f"| {label} | {seconds:.2f} | {seconds / total * 100:.0f}% |")


if __name__ == "__main__":
    main()
