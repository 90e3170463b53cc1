"""Near-duplicate removal: quality against exact ground truth, throughput, skew and task memory.

Corpus: `--originals` random documents of 300 words (20,000 lower-case letter words), each
followed by near copies with 1%, 5%, 20% and 40% of their words replaced (one copy per rate for
a quarter of the originals), shuffled into `--shards` JSONL files (`id`, `n` = order by
(file, position), `text`).

- quality: on a sample of `--sample` documents, ground truth is all-pairs exact Jaccard of
  word 5-gram shingles >= 0.8 plus union-find; precision and recall of the removed documents
  (per truth cluster C: min(|C removed|, |C| - 1) count as right, so which member a tool keeps
  does not matter), for zephyr's `deduplicate_fuzzy` (defaults) and datatrove's MinHash dedup;
  zephyr's recall per planted edit rate with each copy's exact Jaccard to its original;
- throughput (documents/s, files in, files out), back to back in one invocation: a hand-written
  single-process script (reads the files, the same `MinHasher` signatures and band keys, dict
  buckets, union-find in memory, writes the kept lines: the one-core limit), zephyr on a local
  Ray with `--cores` CPUs (its component rounds stop when they settle), zephyr on a skewed
  corpus (30% of documents one identical template),
  datatrove's four MinHash steps on `--cores` workers and Daft (benchmarks/fuzzy_peers.py);
- memory: zephyr's stages run once more with every task in a freshly forked process (the
  fork-per-task backend of bench_dedup.py): each task's peak RSS (VmHWM), per stage.

    uv run --group bench python benchmarks/bench_fuzzy_dedup.py --json benchmarks/results/fuzzy_dedup.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import time

import numpy as np
import orjson

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from fuzzy_peers import kept_ids, run_daft, run_datatrove  # noqa: E402
from machine import load_average, machine, start_local_ray, work_dir  # noqa: E402

from zephyr import Dataset, create_backend  # noqa: E402
from zephyr.dedup.minhash import MinHasher  # noqa: E402

RATES = (0.01, 0.05, 0.20, 0.40)


def _word(i: int) -> str:
    """A lower-case letter word per index (no digits: datatrove's normaliser rewrites them)."""
    letters = ""
    i += 26 * 27
    while i:
        i, r = divmod(i, 26)
        letters += chr(97 + r)
    return letters


VOCAB = [_word(i) for i in range(20_000)]


def make_corpus(originals: int, shards: int, seed: int = 0, template_share: float = 0.0) -> list[list[dict]]:
    rng = random.Random(seed)
    docs = []
    for i in range(originals):
        words = [rng.choice(VOCAB) for _ in range(300)]
        docs.append({"id": f"o{i}", "text": " ".join(words)})
        if i % 4 == 0:
            for rate in RATES:
                copy = list(words)
                for j in rng.sample(range(300), round(rate * 300)):
                    copy[j] = rng.choice(VOCAB)
                docs.append({"id": f"c{i}-{rate}", "text": " ".join(copy), "of": f"o{i}", "rate": rate})
    if template_share:
        template = " ".join(rng.choice(VOCAB) for _ in range(300))
        n = round(len(docs) * template_share / (1 - template_share))
        docs += [{"id": f"t{i}", "text": template} for i in range(n)]
    rng.shuffle(docs)
    size = -(-len(docs) // shards)
    out = [docs[i : i + size] for i in range(0, len(docs), size)]
    for n, d in enumerate(d for shard in out for d in shard):
        d["n"] = n
    return out


def write_corpus(shards: list[list[dict]], directory: str) -> str:
    os.makedirs(directory, exist_ok=True)
    for i, shard in enumerate(shards):
        with open(os.path.join(directory, f"part-{i:05d}.jsonl"), "wb") as f:
            f.writelines(orjson.dumps(d) + b"\n" for d in shard)
    return directory


def shingles(text: str) -> set:
    w = text.lower().split()
    return {tuple(w[i : i + 5]) for i in range(len(w) - 4)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


def truth_clusters(docs: list[dict], threshold: float = 0.8) -> list[set]:
    """The components (of 2 or more documents, as id sets) of all-pairs exact Jaccard >= threshold."""
    sets = [shingles(d["text"]) for d in docs]
    parent = list(range(len(docs)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    for a, b in itertools.combinations(range(len(docs)), 2):
        if jaccard(sets[a], sets[b]) >= threshold:
            ra, rb = find(a), find(b)
            parent[max(ra, rb)] = min(ra, rb)
    groups: dict = {}
    for i, d in enumerate(docs):
        groups.setdefault(find(i), set()).add(d["id"])
    return [g for g in groups.values() if len(g) > 1]


def precision_recall(all_ids: set, kept: set, clusters: list[set]) -> dict:
    """Removals that are right: per truth cluster C, min(|C removed|, |C| - 1), whichever
    member a tool keeps."""
    removed = all_ids - kept
    right = sum(min(len(c & removed), len(c) - 1) for c in clusters)
    should = sum(len(c) - 1 for c in clusters)
    return {"truth_removed": should, "removed": len(removed), "precision": round(right / len(removed), 4) if removed else 1.0,
            "recall": round(right / should, 4) if should else 1.0}


def _text(doc):
    return doc["text"]


def _paths(in_dir: str) -> list[str]:
    return sorted(os.path.join(in_dir, n) for n in os.listdir(in_dir) if n.endswith(".jsonl"))


def zephyr_pipeline(in_dir: str, out_dir: str, **kwargs):
    return Dataset.from_files(_paths(in_dir)).load_jsonl().deduplicate_fuzzy(_text, **kwargs).write_jsonl(
        os.path.join(out_dir, "part-{shard:05d}.jsonl"))


def run_zephyr(in_dir: str, out_dir: str, backend, **kwargs) -> dict:
    shutil.rmtree(out_dir, ignore_errors=True)
    start = time.perf_counter()
    execution = backend.execute(zephyr_pipeline(in_dir, out_dir, **kwargs))
    list(execution)
    seconds = time.perf_counter() - start
    return {"seconds": seconds, "stages_s": [round(st.elapsed, 2) for st in execution.stats]}


def run_script(in_dir: str, out_dir: str) -> dict:
    """The hand-written single-process baseline: reads the files, the same signatures and band
    keys, dict buckets, union-find, writes the kept lines as they are."""
    shutil.rmtree(out_dir, ignore_errors=True)
    os.makedirs(out_dir)
    start = time.perf_counter()
    hasher = MinHasher(5, 20, 11, 0)
    lines = []
    for path in _paths(in_dir):
        with open(path, "rb") as f:
            lines += f.readlines()
    parent = list(range(len(lines)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    signed, signatures = [], []
    for i, line in enumerate(lines):
        sig = hasher.signature(orjson.loads(line)["text"])
        if sig is not None:
            signed.append(i)
            signatures.append(sig)
    buckets: dict = {}
    keys = hasher.band_key_matrix(np.stack(signatures)).tolist() if signatures else []
    for i, row in zip(signed, keys):
        for key in row:
            first = buckets.setdefault(key, i)
            if first != i:
                ra, rb = find(first), find(i)
                parent[max(ra, rb)] = min(ra, rb)
    with open(os.path.join(out_dir, "kept.jsonl"), "wb") as f:
        f.writelines(line for i, line in enumerate(lines) if find(i) == i)
    return {"seconds": time.perf_counter() - start}


def quality(args, work: str) -> dict:
    shards = make_corpus(args.sample // 2, 2, seed=1)
    docs = [d for s in shards for d in s][: args.sample]
    in_dir = write_corpus([docs[: len(docs) // 2], docs[len(docs) // 2 :]], os.path.join(work, "sample"))
    clusters = truth_clusters(docs)
    all_ids = {d["id"] for d in docs}
    backend = create_backend("threadpool", max_parallelism=args.cores, progress=False)
    out = os.path.join(work, "q-zephyr")
    run_zephyr(in_dir, out, backend)
    result = {"docs": len(docs), "zephyr": precision_recall(all_ids, kept_ids(out), clusters)}
    annotated = os.path.join(work, "q-annotated")
    list(backend.execute(zephyr_pipeline(in_dir, annotated, annotate=True)))
    cluster = {}
    for path in _paths(annotated):
        with open(path, "rb") as f:
            cluster.update((d["id"], d["fuzzy_cluster"]) for d in map(orjson.loads, f))
    by_id = {d["id"]: d for d in docs}
    per_rate = {}
    for rate in RATES:
        copies = [d for d in docs if d.get("rate") == rate and d["of"] in by_id]
        sims = [jaccard(shingles(d["text"]), shingles(by_id[d["of"]]["text"])) for d in copies]
        per_rate[f"{rate:.0%}"] = {"pairs": len(copies), "mean_jaccard": round(statistics.mean(sims), 3) if sims else None,
                                   "found": round(sum(cluster[d["id"]] == cluster[d["of"]] for d in copies) / len(copies), 3) if copies else None}
    result["zephyr_per_edit_rate"] = per_rate
    if args.peers:
        out = os.path.join(work, "q-datatrove")
        shutil.rmtree(out, ignore_errors=True)
        run_datatrove(in_dir, out, os.path.join(work, "q-datatrove-work"), args.cores)
        result["datatrove"] = precision_recall(all_ids, kept_ids(out), clusters)
        out = os.path.join(work, "q-daft")
        shutil.rmtree(out, ignore_errors=True)
        daft = run_daft(in_dir, out, args.cores)
        result["daft"] = precision_recall(all_ids, kept_ids(out), clusters) if "error" not in daft else daft
    return result


def speed(args, work: str) -> dict:
    uniform = make_corpus(args.originals, args.shards)
    skewed = make_corpus(round(args.originals * 0.7), args.shards, template_share=0.3)
    n_uniform, n_skewed = sum(map(len, uniform)), sum(map(len, skewed))
    in_uniform, in_skewed = write_corpus(uniform, os.path.join(work, "uniform")), write_corpus(skewed, os.path.join(work, "skewed"))
    start_local_ray(args.cores)
    ray_backend = create_backend("ray", max_parallelism=args.cores, progress=False, scratch_dir=os.path.join(work, "scratch"))
    warm = write_corpus(uniform[:2], os.path.join(work, "warm"))
    run_zephyr(warm, os.path.join(work, "out-warm"), ray_backend)  # start the workers, import the modules
    out = {"docs": n_uniform, "skewed_docs": n_skewed, "runs": []}
    for _ in range(args.repeats):
        run = {"load_before": load_average()}
        script_out, zephyr_out = os.path.join(work, "out-script"), os.path.join(work, "out-zephyr")
        run["script"] = run_script(in_uniform, script_out)
        run["zephyr_ray"] = run_zephyr(in_uniform, zephyr_out, ray_backend)
        run["same_kept"] = kept_ids(script_out) == kept_ids(zephyr_out)
        run["zephyr_ray_skewed"] = run_zephyr(in_skewed, os.path.join(work, "out-skewed"), ray_backend)
        if args.peers:
            dt_out = os.path.join(work, "out-datatrove")
            shutil.rmtree(dt_out, ignore_errors=True)
            run["datatrove"] = run_datatrove(in_uniform, dt_out, os.path.join(work, "datatrove-work"), args.cores)
            run["datatrove"]["removed"] = n_uniform - len(kept_ids(dt_out))
            daft_out = os.path.join(work, "out-daft")
            shutil.rmtree(daft_out, ignore_errors=True)
            run["daft"] = run_daft(in_uniform, daft_out, args.cores)
        run["removed"] = n_uniform - len(kept_ids(zephyr_out))
        run["load_after"] = load_average()
        out["runs"].append(run)
        print(json.dumps(run), file=sys.stderr, flush=True)
    variants = [v for v in ("script", "zephyr_ray", "zephyr_ray_skewed", "datatrove", "daft") if "seconds" in out["runs"][0].get(v, {})]
    med = {v: statistics.median(r[v]["seconds"] for r in out["runs"]) for v in variants}
    out["median_s"] = {v: round(t, 2) for v, t in med.items()}
    out["docs_per_s"] = {v: round((n_skewed if v == "zephyr_ray_skewed" else n_uniform) / t) for v, t in med.items()}
    out["over_script"] = {v: round(med["script"] / t, 2) for v, t in med.items() if v != "zephyr_ray_skewed"}
    out["skewed_over_uniform_per_doc"] = round((med["zephyr_ray_skewed"] / n_skewed) / (med["zephyr_ray"] / n_uniform), 2)
    return out


def memory(args, work: str) -> dict:
    """Zephyr's stages on the uniform corpus with each task in a freshly forked process (forked
    from a small child that holds no corpus): peak RSS per stage, max over its tasks."""
    cmd = [sys.executable, os.path.abspath(__file__), "--memory-child", os.path.join(work, "uniform"), os.path.join(work, "out-memory"),
           os.path.join(work, "scratch-memory"), args.memory]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def memory_child(in_dir: str, out_dir: str, scratch: str, budget: str) -> None:
    from bench_dedup import _fork_per_task_backend, rss_mib

    import pyarrow as pa

    pa.array(["x"])  # as a worker would have it: pyarrow's lazy imports done before forking
    backend = _fork_per_task_backend(budget, scratch)
    submit = backend.submit

    def submit_counting(fn, shared, arg):  # each task's bytes written (its scatter runs or outputs)
        done = submit(fn, shared, arg)
        counters = getattr(done.value, "counters", None) or {}
        backend.tasks[-1].update(bytes_written=counters.get("zephyr/bytes_written", 0), records=counters.get("zephyr/shuffle_records", 0))
        return done

    backend.submit = submit_counting
    docs = sum(1 for path in _paths(in_dir) for _ in open(path, "rb"))
    execution = backend.execute(zephyr_pipeline(in_dir, out_dir))
    list(execution)
    stages = {}
    for stage in sorted({t["stage"] for t in backend.tasks}):
        tasks = [t for t in backend.tasks if t["stage"] == stage]
        stages[str(stage)] = {"tasks": len(tasks), "max_peak_rss_mib": max(t["peak_rss_mib"] for t in tasks),
                              "rss_at_start_mib": max(t["rss_before_mib"] for t in tasks),
                              "bytes_written_per_doc": round(sum(t.get("bytes_written", 0) for t in tasks) / docs, 1),
                              "shuffle_records_per_doc": round(sum(t.get("records", 0) for t in tasks) / docs, 3)}
    print(json.dumps({"memory": budget, "driver_rss_mib": round(rss_mib(), 1), "stages": stages}))


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--originals", type=int, default=40000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--sample", type=int, default=1000)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--memory", default="256MiB", help="zephyr's task memory for the memory pass")
    p.add_argument("--no-peers", dest="peers", action="store_false")
    p.add_argument("--work-dir")
    p.add_argument("--json")
    p.add_argument("--memory-child", nargs=4, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.memory_child:
        return memory_child(*args.memory_child)
    with work_dir(args.work_dir, "fuzzy-bench-") as work:
        result = {"machine": machine(), "load_before": load_average(), "quality": quality(args, work), "speed": speed(args, work),
                  "memory": memory(args, work), "load_after": load_average()}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
