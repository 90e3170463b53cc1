"""Near-duplicate removal: quality against exact ground truth, throughput, and skew.

Corpus: `--originals` random documents of 300 words (vocabulary 20,000), each followed by near
copies with 1%, 5%, 20% and 40% of their words replaced (one copy per rate for a quarter of
the originals), shuffled into `--shards` shards.

- quality: on a sample of `--sample` documents, ground truth is all-pairs exact Jaccard of
  word 5-gram shingles >= 0.8 plus union-find (removed = every member but the first of each
  component); precision and recall of the documents `deduplicate_fuzzy` removes (defaults),
  and the recall per planted edit rate with each copy's exact Jaccard to its original;
- throughput (documents/s, whole corpus): zephyr on a local Ray with `--cores` CPUs vs a
  hand-written single-process script using the same signature code (`MinHasher`), buckets in
  dicts and union-find in memory (the one-core limit);
- skew: the same job where 30% of the documents are one identical template, vs uniform.

    uv run python benchmarks/bench_fuzzy_dedup.py --json benchmarks/results/fuzzy_dedup.json
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import random
import statistics
import sys
import time

os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine, start_local_ray  # noqa: E402

from zephyr import Dataset, create_backend  # noqa: E402
from zephyr.dedup.minhash import MinHasher  # noqa: E402

RATES = (0.01, 0.05, 0.20, 0.40)
VOCAB = [f"w{i}" for i in range(20_000)]


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
    return [docs[i : i + size] for i in range(0, len(docs), size)]


def shingles(text: str) -> set:
    w = text.lower().split()
    return {tuple(w[i : i + 5]) for i in range(len(w) - 4)}


def jaccard(a: set, b: set) -> float:
    return len(a & b) / len(a | b)


def truth_removed(docs: list[dict], threshold: float = 0.8) -> set:
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
    return {docs[i]["id"] for i in range(len(docs)) if find(i) != i}


def _flatten(shard):
    return shard


def _text(doc):
    return doc["text"]


def run_zephyr(shards: list[list[dict]], backend) -> tuple[set, float]:
    start = time.perf_counter()
    kept = {d["id"] for d in backend.execute(Dataset.from_list(shards).flat_map(_flatten).deduplicate_fuzzy(_text))}
    return kept, time.perf_counter() - start


def run_script(shards: list[list[dict]]) -> tuple[set, float]:
    """The hand-written single-process baseline: same signatures, dict buckets, union-find."""
    start = time.perf_counter()
    hasher = MinHasher(5, 20, 11, 0)
    docs = [d for shard in shards for d in shard]
    parent = list(range(len(docs)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    buckets: dict = {}
    for i, d in enumerate(docs):
        sig = hasher.signature(d["text"])
        if sig is None:
            continue
        for band, key in enumerate(hasher.band_keys(sig)):
            first = buckets.setdefault((band, key), i)
            if first != i:
                ra, rb = find(first), find(i)
                parent[max(ra, rb)] = min(ra, rb)
    kept = {docs[i]["id"] for i in range(len(docs)) if find(i) == i}
    return kept, time.perf_counter() - start


def quality(args) -> dict:
    shards = make_corpus(args.sample // 2, 2, seed=1)
    docs = [d for s in shards for d in s][: args.sample]
    shards = [docs[: len(docs) // 2], docs[len(docs) // 2 :]]
    truth = truth_removed(docs)
    backend = create_backend("threadpool", max_parallelism=args.cores, progress=False)
    kept, _ = run_zephyr(shards, backend)
    removed = {d["id"] for d in docs} - kept
    pipeline = Dataset.from_list(shards).flat_map(_flatten).deduplicate_fuzzy(_text, annotate=True)
    cluster = {d["id"]: d["fuzzy_cluster"] for d in backend.execute(pipeline)}
    by_id = {d["id"]: d for d in docs}
    per_rate = {}
    for rate in RATES:
        copies = [d for d in docs if d.get("rate") == rate and d["of"] in by_id]
        sims = [jaccard(shingles(d["text"]), shingles(by_id[d["of"]]["text"])) for d in copies]
        per_rate[f"{rate:.0%}"] = {"pairs": len(copies), "mean_jaccard": round(statistics.mean(sims), 3) if sims else None,
                                   "found": round(sum(cluster[d["id"]] == cluster[d["of"]] for d in copies) / len(copies), 3) if copies else None}
    tp = len(removed & truth)
    return {"docs": len(docs), "truth_removed": len(truth), "removed": len(removed),
            "precision": round(tp / len(removed), 4) if removed else 1.0, "recall": round(tp / len(truth), 4) if truth else 1.0,
            "per_edit_rate": per_rate}


def speed(args) -> dict:
    uniform = make_corpus(args.originals, args.shards)
    skewed = make_corpus(round(args.originals * 0.7), args.shards, template_share=0.3)
    n_uniform, n_skewed = sum(map(len, uniform)), sum(map(len, skewed))
    start_local_ray(args.cores)
    ray_backend = create_backend("ray", max_parallelism=args.cores, progress=False)
    run_zephyr(uniform[:2], ray_backend)  # warm the workers
    out = {"docs": n_uniform, "skewed_docs": n_skewed, "runs": []}
    for _ in range(args.repeats):
        kept_s, t_script = run_script(uniform)
        kept_z, t_zephyr = run_zephyr(uniform, ray_backend)
        _, t_skew = run_zephyr(skewed, ray_backend)
        out["runs"].append({"script_s": round(t_script, 2), "zephyr_ray_s": round(t_zephyr, 2), "zephyr_ray_skewed_s": round(t_skew, 2),
                            "same_kept": kept_s == kept_z})
    med = {k: statistics.median(r[k] for r in out["runs"]) for k in ("script_s", "zephyr_ray_s", "zephyr_ray_skewed_s")}
    out["median"] = med
    out["docs_per_s"] = {"script_1_core": round(n_uniform / med["script_s"]), f"zephyr_ray_{args.cores}_cores": round(n_uniform / med["zephyr_ray_s"]),
                         "zephyr_skewed": round(n_skewed / med["zephyr_ray_skewed_s"])}
    out["zephyr_over_script"] = round(med["script_s"] / med["zephyr_ray_s"], 2)
    out["skewed_over_uniform_per_doc"] = round((med["zephyr_ray_skewed_s"] / n_skewed) / (med["zephyr_ray_s"] / n_uniform), 2)
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--originals", type=int, default=8000)
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--sample", type=int, default=1200)
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--json")
    args = p.parse_args()
    result = {"machine": machine(), "load_before": load_average(), "quality": quality(args), "speed": speed(args), "load_after": load_average()}
    print(json.dumps(result, indent=2))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(result, f, indent=2)


if __name__ == "__main__":
    main()
