"""deduplicate_fuzzy after an exact deduplicate (origins carried through a shuffle, wide ids)
next to deduplicate_fuzzy over the same documents read from files (a source stage, narrow ids).

Corpus: `--docs` documents of 200 words in `--shards` JSONL files: originals (a third of the
count), exact copies and near copies (one word replaced) of them, in random order.

- `after-exact`: `load_jsonl().deduplicate(text).deduplicate_fuzzy(text)` over the corpus;
- `source`: the same corpus exact-deduplicated by hand first (first copies, in file order, the
  same files), then `load_jsonl().deduplicate_fuzzy(text)`.
Both keep the first document of each cluster in file order, so their kept ids must be equal
(checked). Each runs in a fresh process on the sync backend; reported: the process's CPU
seconds and peak RSS, and the CPU seconds of the fuzzy stages (the last 7 of each plan: the
signature stage, which in `after-exact` also reads the exact dedup's shuffle, then the
bucket, component and apply stages).

    uv run python benchmarks/bench_fuzzy_after_dedup.py --docs 30000 --json fuzzy_after_dedup.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, work_dir  # noqa: E402


def text(record: dict) -> str:
    return record["text"]


def make_corpus(raw: str, exact: str, docs: int, shards: int) -> None:
    rng = random.Random(0)
    vocab = [f"w{i}" for i in range(20_000)]
    originals = [[rng.choice(vocab) for _ in range(200)] for _ in range(docs // 3)]
    files: list[list[dict]] = [[] for _ in range(shards)]
    for i in range(docs):
        words = list(rng.choice(originals))
        if rng.random() < 0.5:
            words[rng.randrange(len(words))] = rng.choice(vocab)
        files[rng.randrange(shards)].append({"id": i, "text": " ".join(words)})
    seen: set = set()
    for s, records in enumerate(files):
        firsts = [r for r in records if not (r["text"] in seen or seen.add(r["text"]))]
        for directory, rows in ((raw, records), (exact, firsts)):
            with open(os.path.join(directory, f"in-{s:03d}.jsonl"), "w") as f:
                f.writelines(json.dumps(r) + "\n" for r in rows)


def child(variant: str, source: str, out: str, scratch: str) -> None:
    from zephyr import Dataset, create_backend

    ds = Dataset.from_files(os.path.join(source, "*.jsonl")).load_jsonl()
    ds = ds.deduplicate(text) if variant == "after-exact" else ds
    ds = ds.deduplicate_fuzzy(text).write_jsonl(os.path.join(out, "part-{shard:03d}.jsonl"))
    start, cpu = time.perf_counter(), time.process_time()
    execution = create_backend("sync", progress=False, scratch_dir=scratch).execute(ds)
    list(execution)
    kept = sorted(json.loads(line)["id"] for name in os.listdir(out) if name.startswith("part") for line in open(os.path.join(out, name)))
    print("RESULT " + json.dumps({
        "variant": variant, "seconds": round(time.perf_counter() - start, 2), "cpu_s": round(time.process_time() - cpu, 2),
        "fuzzy_stages_cpu_s": round(sum(s.cost.cpu_s for s in execution.stats[-7:]), 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1), "kept": kept}))


def run(variant: str, source: str, work: str) -> dict:
    out = os.path.join(work, f"out-{variant}")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", variant, source, out, os.path.join(work, "scratch")],
                          capture_output=True, text=True, check=False, timeout=3600)
    if proc.returncode != 0:
        raise RuntimeError(f"{variant} failed:\n{proc.stderr[-3000:]}")
    return json.loads(next(line for line in proc.stdout.splitlines() if line.startswith("RESULT "))[len("RESULT "):])


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--docs", type=int, default=30_000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--rounds", type=int, default=2, help="run both variants this many times, in turn")
    p.add_argument("--work-dir")
    p.add_argument("--json")
    p.add_argument("--child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        return child(*args.child)
    with work_dir(args.work_dir, "fuzzy-after-dedup-") as work:
        raw, exact = os.path.join(work, "raw"), os.path.join(work, "exact")
        os.makedirs(raw), os.makedirs(exact)
        make_corpus(raw, exact, args.docs, args.shards)
        result = {"machine": machine(), "load_before": load_average(), "docs": args.docs, "rounds": []}
        for _ in range(args.rounds):
            result["rounds"].append([run("after-exact", raw, work), run("source", exact, work)])
        result["load_after"] = load_average()
    for pair in result["rounds"]:
        pair[0]["same_kept_as_source"] = pair[0].pop("kept") == pair[1].pop("kept")
    print(json.dumps(result, indent=1))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=1)
    if not all(pair[0]["same_kept_as_source"] for pair in result["rounds"]):
        raise SystemExit("the two variants kept different documents")


if __name__ == "__main__":
    main()
