"""Key skew: a group_by where one partition holds 80% of the records vs the same bytes with uniform keys.

Both jobs read the same number of records of the same sizes (`{"key", "i", "text"}`, text of
100-400 chars; JSONL.zst files written before timing) and group them into `--partitions`
output shards on a warm local Ray with `--cores` CPUs:

- uniform: keys drawn uniformly from `--keys` distinct keys;
- skewed: 80% of the records take one of `--keys` distinct keys that all hash to partition 0,
  the rest are uniform (so partition 0 holds ~80% of the data, under many keys);
- skewed, splitting off (`ZEPHYR_SKEW_MAX_PIECES=1`): what the skewed job costs without
  cutting partition 0 into key ranges.

The reducer hashes every text of its group (some real per-item work, as a dedup or a
clustering reducer has); outputs are written as JSONL. Each variant runs `--repeats` times,
alternating; the table reports medians of the whole job and of its reduce stage, and their
ratios to uniform.

    uv run python benchmarks/bench_skew.py --json benchmarks/results/skew.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import sys
import tempfile
import time

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, start_local_ray  # noqa: E402


def hot_keys(count: int, partitions: int) -> list[str]:
    """`count` distinct keys that all land in partition 0."""
    from zephyr.shuffle.keys import hash_key_bytes, key_bytes

    found: list[str] = []
    start = 0
    while len(found) < count:
        candidates = [f"hot-{i}" for i in range(start, start + 100_000)]
        parts = hash_key_bytes([key_bytes(k) for k in candidates]) % partitions
        found += [k for k, p in zip(candidates, parts) if p == 0]
        start += 100_000
    return found[:count]


def make_records(spec: tuple) -> list[dict]:
    """One input shard's records (a pure function of the shard index and the spec)."""
    shard, per_shard, keys, hot = spec
    rng = random.Random(shard)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
    out = []
    for j in range(per_shard):
        if hot is not None and rng.random() < 0.8:
            key = hot[rng.randrange(len(hot))]
        else:
            key = f"k-{rng.randrange(keys)}"
        text = " ".join(rng.choice(words) for _ in range(rng.randint(15, 60)))
        out.append({"key": key, "i": shard * per_shard + j, "text": text})
    return out


def digest_group(key, items):
    import hashlib

    n, digest = 0, hashlib.blake2b(digest_size=16)
    for item in items:
        n += 1
        digest.update(hashlib.blake2b(item["text"].encode(), digest_size=16).digest())
    return {"key": key, "n": n, "digest": digest.hexdigest()}


def write_inputs(backend, specs: list, directory: str) -> list[str]:
    from zephyr import Dataset

    return list(backend.execute(Dataset.from_list(specs).flat_map(make_records).write_jsonl(
        os.path.join(directory, "part-{shard:05d}.jsonl.zst"))))


def _key(record):
    return record["key"]


def run_once(backend, paths: list, partitions: int, out_dir: str) -> dict:
    from zephyr import Dataset

    shutil.rmtree(out_dir, ignore_errors=True)
    ds = (Dataset.from_files(paths).load_jsonl()
          .group_by(_key, digest_group, num_output_shards=partitions)
          .write_jsonl(os.path.join(out_dir, "part-{shard:05d}.jsonl")))
    start = time.perf_counter()
    execution = backend.execute(ds)
    list(execution)
    seconds = time.perf_counter() - start
    reduce_stage = execution.stats[-1]
    return {"seconds": seconds, "map_s": round(execution.stats[0].elapsed, 2), "reduce_s": round(reduce_stage.elapsed, 2),
            "reduce_tasks": reduce_stage.num_shards,
            "largest": [{"partition": p.partition, "mb": round(p.bytes / 1e6, 1), "pieces": p.pieces} for p in reduce_stage.largest_partitions]}


def main(argv=None) -> dict:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     epilog="example: uv run python benchmarks/bench_skew.py --records 1000000 --cores 2")
    parser.add_argument("--records", type=int, default=1_000_000, help="records in all (default 1,000,000)")
    parser.add_argument("--shards", type=int, default=8, help="input shards (default 8)")
    parser.add_argument("--partitions", type=int, default=8, help="output shards of the group_by (default 8)")
    parser.add_argument("--keys", type=int, default=100_000, help="distinct keys per key pool (default 100,000)")
    parser.add_argument("--cores", type=int, default=2, help="num_cpus of the local Ray (default 2)")
    parser.add_argument("--memory", default="512MiB", help="task memory budget (default 512MiB)")
    parser.add_argument("--repeats", type=int, default=3, help="runs per variant, alternating (default 3)")
    parser.add_argument("--niceness", type=int, default=15,
                        help="niceness of Ray's workers (RAY_worker_niceness; default 15, Ray's own default)")
    parser.add_argument("--json", default=None, help="write the results to this JSON file")
    args = parser.parse_args(argv)
    os.environ["RAY_worker_niceness"] = str(args.niceness)

    import ray
    from zephyr import Dataset, create_backend

    load_before = load_average()
    per_shard = args.records // args.shards
    hot = hot_keys(args.keys, args.partitions)
    specs = {"uniform": [(s, per_shard, args.keys, None) for s in range(args.shards)],
             "skewed": [(s, per_shard, args.keys, hot) for s in range(args.shards)]}
    variants = [("uniform", {}), ("skewed", {}), ("skewed, splitting off", {"ZEPHYR_SKEW_MAX_PIECES": "1"})]
    work = tempfile.mkdtemp(prefix="zephyr-bench-skew-")
    start_local_ray(args.cores)
    runs: dict[str, list] = {name: [] for name, _ in variants}
    try:
        backend = create_backend("ray", memory=args.memory, progress=False, scratch_dir=os.path.join(work, "scratch"))
        inputs = {kind: write_inputs(backend, spec, os.path.join(work, kind)) for kind, spec in specs.items()}  # also warms
        run_once(backend, inputs["uniform"], args.partitions, os.path.join(work, "out"))  # untimed: imports in workers
        for _ in range(args.repeats):
            for name, env in variants:
                os.environ.pop("ZEPHYR_SKEW_MAX_PIECES", None)
                os.environ.update(env)
                runs[name].append(run_once(backend, inputs[name.split(",")[0]], args.partitions, os.path.join(work, "out")))
                print(name, runs[name][-1], flush=True)
        os.environ.pop("ZEPHYR_SKEW_MAX_PIECES", None)
    finally:
        ray.shutdown()
        shutil.rmtree(work, ignore_errors=True)
    uniform = statistics.median(r["seconds"] for r in runs["uniform"])
    result = {"benchmark": "skew", "machine": machine(), "load_avg_before": load_before, "load_avg_after": load_average(),
              "params": vars(args), "runs": runs,
              "medians": {name: round(statistics.median(r["seconds"] for r in rs), 2) for name, rs in runs.items()},
              "reduce_medians": {name: round(statistics.median(r["reduce_s"] for r in rs), 2) for name, rs in runs.items()}}
    uniform_reduce = result["reduce_medians"]["uniform"]
    print(f"\nSkew: {args.records:,} records, {args.shards} input shards -> {args.partitions} partitions, {args.cores} CPUs on Ray; "
          f"load avg before {load_before}, after {result['load_avg_after']}\n")
    print("| keys | job runs (s) | job median (s) | vs uniform | reduce stage median (s) | vs uniform | reduce tasks | largest partition |")
    print("|---|---|---|---|---|---|---|---|")
    for name, rs in runs.items():
        median = result["medians"][name]
        top = rs[-1]["largest"][0] if rs[-1]["largest"] else {}
        seconds = ", ".join(f"{r['seconds']:.1f}" for r in rs)
        reduce = result["reduce_medians"][name]
        print(f"| {name} | {seconds} | {median:.1f} | {median / uniform:.2f}x | {reduce:.1f} | {reduce / uniform_reduce:.2f}x | "
              f"{rs[-1]['reduce_tasks']} | {top.get('mb', 0)} MB in {top.get('pieces', 1)} piece(s) |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    return result


if __name__ == "__main__":
    main()
