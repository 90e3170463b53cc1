"""CPU ms per step of the exact dedup's map-side spill, and the alternatives to each (issue 39).

Runs profile_dedup_stages.py's job (sync backend, 256 MiB per task) once to capture its first
spill buffers (the Arrow batches `_Buffer._spill_arrow` receives), then replays the spill's
steps on fresh copies of them (a freshly filled buffer: the pool's pages handed back, as the
spill does) and times each step and each candidate replacement, best of `--reps`:

    uv run --group bench python benchmarks/bench_spill.py --docs 500000
"""

from __future__ import annotations

import argparse
import io
import os
import shutil
import sys
import tempfile
import time

import numpy as np
import polars as pl
import pyarrow as pa

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from corpus import ensure_corpus


def capture(docs: int, keep: int) -> list[tuple]:
    """(batches, schema, partitions) of the job's first `keep` Arrow spills."""
    from zephyr import Dataset, col, create_backend
    from zephyr.shuffle import scatter

    corpus = os.path.join(tempfile.gettempdir(), f"zephyr-dedup-corpus-{docs}")
    info = ensure_corpus(corpus, num_shards=8, docs_per_shard=docs // 8, dup_fraction=0.1,
                         min_chars=50, max_chars=400, seed=4)  # profile_dedup_stages.py's
    buffers: list[tuple] = []
    spill = scatter._Buffer._spill_arrow

    def captured(self, stem, combiner):
        if len(buffers) < keep:
            buffers.append((list(self.batches), self.schema, self.sink.num_partitions))
        return spill(self, stem, combiner)

    scatter._Buffer._spill_arrow = captured
    work = tempfile.mkdtemp(prefix="zephyr-bench-spill-")
    try:
        backend = create_backend("sync", memory="256MiB", progress=False, scratch_dir=os.path.join(work, "scratch"))
        list(backend.execute(Dataset.from_files(list(info.paths)).load_jsonl().deduplicate(col("text"))
                             .write_jsonl(os.path.join(work, "out", "part-{shard:05d}.jsonl"))))
    finally:
        scatter._Buffer._spill_arrow = spill
        shutil.rmtree(work, ignore_errors=True)
    return buffers


def fresh(batches: list[pa.RecordBatch]) -> list[pa.RecordBatch]:
    """Copies of `batches` in new memory, the pool's free pages handed back (a newly filled buffer)."""
    copies = [pa.RecordBatch.from_arrays([pa.concat_arrays([c]) for c in b.columns], schema=b.schema) for b in batches]
    pa.default_memory_pool().release_unused()
    return copies


def timed(times: dict, label: str, f):
    start = time.process_time()
    result = f()
    times.setdefault(label, []).append((time.process_time() - start) * 1000)
    return result


def _sorted(table: pa.Table) -> pa.Table:
    from zephyr.shuffle.merge import group_starts, sort_order

    order = sort_order(table, leading="p")
    order = order[group_starts(table.column("h").to_numpy()[order], table.column("kb"), order, None)]
    return table.take(pa.array(order))


def replay(buffer: tuple, times: dict, work: str) -> None:
    """The spill's steps as `_spill_arrow` runs them, then the candidates, each on a fresh buffer."""
    from zephyr.shuffle.merge import group_starts, sort_order
    from zephyr.shuffle.runs import ArrowRunWriter

    batches, schema, partitions = buffer
    table = pa.Table.from_batches(fresh(batches), schema=schema)
    timed(times, "as is: concat + sort_order + keep-first + take", lambda: _sorted(table.combine_chunks()))
    del table
    table = timed(times, "concat (combine_chunks)", lambda: pa.Table.from_batches(fresh(batches), schema=schema).combine_chunks())
    order = timed(times, "sort_order (p, h; collision check)", lambda: sort_order(table, leading="p"))
    order = timed(times, "keep-first (group_starts)",
                  lambda: order[group_starts(table.column("h").to_numpy()[order], table.column("kb"), order, None)])
    ordered = timed(times, "take (one table)", lambda: table.take(pa.array(order)))
    p = ordered.column("p").to_numpy()
    bounds = np.searchsorted(p, np.arange(partitions + 1, dtype=np.uint32), side="left")
    ordered = ordered.drop_columns(["p"])
    for codec in ("none", "lz4", "zstd"):
        os.environ["ZEPHYR_SHUFFLE_COMPRESSION"] = codec
        path = os.path.join(work, f"run-{codec}.arrow")

        def write():
            with open(path, "wb") as f:
                ArrowRunWriter(f, path, ordered.schema, partitions).write(ordered, bounds)
        timed(times, f"IPC write, {codec}", write)
        times.setdefault(f"run MB, {codec}", []).append(os.path.getsize(path) / 1e6)
    os.environ.pop("ZEPHYR_SHUFFLE_COMPRESSION")

    def raw():
        with open(os.path.join(work, "raw.bin"), "wb") as f:
            for column in ordered.columns:
                for buf in column.chunks[0].buffers():
                    if buf is not None:
                        f.write(buf)
    timed(times, "floor: the same bytes, plain file writes", raw)
    del table, ordered
    # candidates for one copy instead of two (concat, then take), each from a fresh buffer to a run
    chunked = pa.Table.from_batches(fresh(batches), schema=schema)
    timed(times, "alt: no concat: sort_order + keep-first + take on the chunks", lambda: _sorted(chunked))
    del chunked
    table = pa.Table.from_batches(fresh(batches), schema=schema).combine_chunks()
    step = max(1, len(order) // 36)  # ~1 MiB batches, as the writer makes
    timed(times, "alt: take per ~1 MiB batch as written (never the whole sorted copy)",
          lambda: [table.take(pa.array(order[i:i + step])) for i in range(0, len(order), step)])
    del table
    chunked = pa.Table.from_batches(fresh(batches), schema=schema)
    timed(times, "alt: Polars from_arrow + gather (take only)", lambda: pl.from_arrow(chunked, rechunk=False)[pl.Series(order)])
    h, p = chunked.column("h").to_numpy(), chunked.column("p").to_numpy()
    timed(times, "  np.lexsort((h, p)) (sort_order's core)", lambda: np.lexsort((h, p)))
    timed(times, "  alt: stable argsort h, then radix argsort p (uint16)",
          lambda: (o := np.argsort(h, kind="stable"))[np.argsort(p[o].astype(np.uint16), kind="stable")])
    sizes = {name: chunked.column(name).nbytes / 1e6 for name in chunked.schema.names}
    times.setdefault("buffer MB", []).append(sum(sizes.values()))
    times.setdefault("  of which kb (key bytes) MB", []).append(sizes["kb"])
    times.setdefault("rows", []).append(chunked.num_rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--docs", type=int, default=500_000)
    parser.add_argument("--buffers", type=int, default=3)
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    import pandas  # noqa: F401  pyarrow imports it on first use
    buffers = capture(args.docs, args.buffers)
    times: dict[str, list[float]] = {}
    work = tempfile.mkdtemp(prefix="zephyr-bench-spill-")
    try:
        replay(buffers[0], {}, work)  # warm: the compute kernels' first use
        for _ in range(args.reps):
            for buffer in buffers:
                replay(buffer, times, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    n = len(buffers)
    print(f"{args.docs:,} docs, {n} spill buffers, best of {args.reps} per buffer, mean over buffers:")
    for label, values in times.items():
        best = np.mean([min(values[i::n]) for i in range(n)])
        print(f"| {label} | {best:.1f} |")


if __name__ == "__main__":
    main()
