"""The work of one zephyr task, written once per engine, for `bench_task_engines.py`.

Every engine module offers the same four jobs, each the work of ONE task on one core:

- `map_shard(src, out_dir, form)`: decompress and scan one `.jsonl.zst` shard, hash `text` to
  64 bits, split the rows into `NUM_PARTITIONS` partitions by hash, sort each by (hash, position)
  and write it as an uncompressed Arrow IPC stream (`run_path(out_dir, p)`). `form` says what a
  run carries besides hash and position: `"line"` the original JSON line, `"columns"` the parsed
  id/url/text columns (`"line-path"`, Polars only: the line, `text` taken by a JSON path).
- `reduce_partition(runs, out, form)`: read one partition's runs (one per shard, in shard
  order), keep the first row of each hash by (shard, position), write the kept rows in (shard,
  position) order as JSON lines to `out` (zstd level 3 when it ends in `.zst`).
- `w1_filter(src, out, min_chars)`: add `num_chars` (characters of `text`), keep rows with at
  least `min_chars`, write JSON lines.
- `count_domains(src, out)`: the host of `url` as `domain`, rows per domain: a partial
  aggregation, written as an Arrow IPC stream (domain, count) sorted by domain.

Each engine hashes with what it has natively (the hash decides only which partition a row
goes to and the run order; the checks compare rows, not hashes). `ENGINES` maps a variant name
to its module and the keyword arguments its jobs take.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Callable

__all__ = ["ENGINES", "NUM_PARTITIONS", "ZSTD_LEVEL", "job", "run_path"]

NUM_PARTITIONS = 8
ZSTD_LEVEL = 3

ENGINES: dict[str, tuple[str, dict]] = {
    "python": ("task_engines.python_loop", {}),
    "pyarrow": ("task_engines.arrow", {}),
    "polars-eager": ("task_engines.polars_jobs", {"lazy": False}),
    "polars-lazy": ("task_engines.polars_jobs", {"lazy": True}),
    "duckdb": ("task_engines.duckdb_jobs", {}),
    "datafusion": ("task_engines.datafusion_jobs", {}),
}


def job(engine: str, name: str) -> Callable:
    """The function for job `name` of `engine`, its engine arguments bound; imports the engine."""
    module_name, kwargs = ENGINES[engine]
    fn = getattr(importlib.import_module(module_name), name)
    return lambda *args: fn(*args, **kwargs)


def run_path(out_dir: str, partition: int) -> str:
    """The map's run for `partition` in `out_dir`."""
    return os.path.join(out_dir, f"part-{partition:02d}.arrows")
