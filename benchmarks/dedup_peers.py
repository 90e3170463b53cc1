"""The exact-dedup job in two peer systems, for `bench_dedup.py --peers`.

Both read the same JSONL.zst corpus with all cores and write the kept documents as JSON lines:

- **Ray Data**: `read_json(paths)`, add the key column (the same blake2b hex of the text that
  zephyr's run uses) with `map_batches`, `groupby("key").map_groups(first row)`, `write_json`.
- **datatrove**: its exact-dedup pipeline (`ExactDedupSignature` -> `ExactFindDedups` ->
  `ExactDedupFilter` + `JsonlWriter`) on `LocalPipelineExecutor` with one task per input file
  and `cores` worker processes. datatrove keeps one document per duplicate cluster by its own
  order, so kept ids may differ from "first by shard and position"; the count must match.

Neither is installed by the default `uv sync`: `uv run --group bench python benchmarks/bench_dedup.py --peers`.
"""

from __future__ import annotations

import hashlib
import os
import time

from machine import start_local_ray

__all__ = ["run_datatrove", "run_raydata"]


def _first_row(group):
    return group.slice(0, 1)


def _with_key(batch):
    import pyarrow as pa

    texts = batch.column("text").to_pylist()
    keys = [hashlib.blake2b(t.encode(), digest_size=16).hexdigest() for t in texts]
    return batch.append_column("key", pa.array(keys, pa.string()))


def run_raydata(paths: list[str], out_dir: str, cores: int) -> dict:
    """Ray Data's groupby(key).map_groups(first) on a local Ray of `cores` CPUs (ray.init excluded)."""
    import ray

    start_local_ray(cores)
    try:
        import ray.data

        ctx = ray.data.DataContext.get_current()
        ctx.enable_progress_bars = False
        start = time.perf_counter()
        ds = ray.data.read_json(list(paths), arrow_open_stream_args={"compression": "zstd"})
        ds = ds.map_batches(_with_key, batch_format="pyarrow")
        ds = ds.groupby("key").map_groups(_first_row, batch_format="pyarrow")
        ds.write_json(out_dir)
        seconds = time.perf_counter() - start
    finally:
        ray.shutdown()
    return {"seconds": seconds, "cores": cores}


def run_datatrove(paths: list[str], out_dir: str, work: str, cores: int) -> dict:
    """datatrove's three-step exact dedup with one task per input file on `cores` workers."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.exact_dedup import ExactDedupConfig, ExactDedupFilter, ExactDedupSignature, ExactFindDedups
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter

    data_dir = os.path.dirname(paths[0])
    names = [os.path.basename(p) for p in paths]
    paths_file = os.path.join(work, "datatrove-inputs.txt")
    with open(paths_file, "w") as f:
        f.write("\n".join(names) + "\n")
    config = ExactDedupConfig(content_getter=_text_getter)
    sigs, dups, logs = (os.path.join(work, f"datatrove-{name}") for name in ("sigs", "dups", "logs"))

    def reader():
        return JsonlReader(data_dir, paths_file=paths_file, compression="zstd", text_key="text", id_key="id")

    start = time.perf_counter()
    steps = [
        [reader(), ExactDedupSignature(output_folder=sigs, config=config, finder_workers=1)],
        [ExactFindDedups(data_folder=sigs, output_folder=dups, config=config)],
        [reader(), ExactDedupFilter(data_folder=dups, config=config), JsonlWriter(out_dir, compression="zstd")],
    ]
    tasks = [len(paths), 1, len(paths)]
    for i, (pipeline, n) in enumerate(zip(steps, tasks)):
        LocalPipelineExecutor(pipeline, tasks=n, workers=min(n, cores), logging_dir=f"{logs}-{i}",
                              start_method="fork").run()
    return {"seconds": time.perf_counter() - start, "cores": cores}


def _text_getter(doc) -> bytes:
    return doc.text.encode()


# datatrove picks its hash function from the getter's return annotation, which must be the type
# itself (this module's `from __future__ import annotations` would make it the string "bytes")
_text_getter.__annotations__["return"] = bytes
