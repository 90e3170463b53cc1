"""Connected components in `deduplicate_fuzzy`: rounds used and time per round on chains.

A chain of n links is n + 1 documents where document i holds node i's three words and node
i + 1's (word 1-grams, 200 bands of 2 rows: neighbours at Jaccard 1/3 always share a bucket,
others never), in path order (ids ascending along the chain: the slowest order measured), in
`--shards` input shards, on the threadpool backend with `--cores` workers. Per chain: the
rounds the run added, the time of the signature and bucket stages, of each round and of the
last stage, CPU seconds and peak RSS of the process; the baseline in the same run is a
one-process union-find over the same "shares a word" edges (the test oracle), and each run is
checked to keep exactly one document.

`--simulate` also runs the round operations in plain Python on chains (ids along the path, and
shuffled): the large-star / small-star alternation zephyr uses, and the alternative that links
each node's whole neighbourhood to its smallest member (fewer rounds, but its edges multiply).
`--cluster N` adds one cluster of N identical pages (default 0: skipped).

    uv run python benchmarks/bench_cc_rounds.py --simulate --cluster 1000000 --json benchmarks/results/cc_rounds.json
"""

from __future__ import annotations

import argparse
import json
import os
import random
import resource
import statistics
import sys
import time
from collections import defaultdict

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average, machine  # noqa: E402

from zephyr import Dataset, create_backend  # noqa: E402

EXACT = {"ngram": 1, "num_perms": 400, "bands": 200}


def chain_docs(links: int) -> list[dict]:
    def words(i):
        return f"c{i}a c{i}b c{i}c"
    return [{"id": i, "text": f"{words(i)} {words(i + 1)}"} for i in range(links + 1)]


def in_shards(docs: list, num_shards: int) -> list[list]:
    size = -(-len(docs) // num_shards)
    return [docs[k * size : (k + 1) * size] for k in range(num_shards)]


def _identity(shard):
    return shard


def _text(record):
    return record["text"]


def union_find_seconds(docs: list[dict]) -> tuple[float, int]:
    """The baseline: union-find over the documents that share a word; (seconds, components)."""
    start = time.perf_counter()
    parent = list(range(len(docs)))

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    holders = defaultdict(list)
    for i, doc in enumerate(docs):
        for word in set(doc["text"].split()):
            holders[word].append(i)
    for members in holders.values():
        for other in members[1:]:
            a, b = find(members[0]), find(other)
            parent[max(a, b)] = min(a, b)
    components = len({find(i) for i in range(len(docs))})
    return time.perf_counter() - start, components


def _cpu() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def run_zephyr(shards: list[list], cores: int, **options) -> dict:
    backend = create_backend("threadpool", max_parallelism=cores, progress=False)
    cpu, start = _cpu(), time.perf_counter()
    try:
        execution = backend.execute(Dataset.from_list(shards).flat_map(_identity).deduplicate_fuzzy(_text, **options))
        kept = sum(1 for _ in execution)
    finally:
        backend.close()
    seconds = time.perf_counter() - start
    rounds = [s.elapsed for s in execution.stats if "round " in s.description]
    return {
        "seconds": round(seconds, 2), "cpu_s": round(_cpu() - cpu, 2), "kept": kept,
        "rounds": execution.counters["zephyr/cc_rounds"], "round_stages": len(rounds),
        "signatures_and_buckets_s": round(sum(s.elapsed for s in execution.stats[:2]), 2),
        "round_s_mean": round(statistics.mean(rounds), 3), "round_s_min": round(min(rounds), 3),
        "round_s_max": round(max(rounds), 3), "rounds_s": round(sum(rounds), 2),
        "last_stage_s": round(execution.stats[-1].elapsed, 2),
        "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
    }


def chains(args) -> list[dict]:
    rows = []
    for links in args.links:
        docs = chain_docs(links)
        baseline_s, components = union_find_seconds(docs)
        row = {"links": links, "load_before": load_average(), **run_zephyr(in_shards(docs, args.shards), args.cores, **EXACT)}
        row.update(union_find_s=round(baseline_s, 3), components=components, load_after=load_average())
        row["over_union_find"] = round(row["seconds"] / max(baseline_s, 1e-6))
        assert row["kept"] == components == 1, row
        rows.append(row)
        print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def cluster(args) -> dict:
    page = "the same boilerplate page in every shard"
    docs = [{"id": i, "text": page} for i in range(args.cluster)]
    row = {"members": args.cluster, "load_before": load_average(), **run_zephyr(in_shards(docs, args.shards), args.cores)}
    row["load_after"] = load_average()
    assert row["kept"] == 1, row
    print(json.dumps(row), file=sys.stderr, flush=True)
    return row


# ---- the round operations in plain Python ----------------------------------------------------------

def _adjacency(edges):
    adj = defaultdict(set)
    for u, v in edges:
        adj[u].add(v)
        adj[v].add(u)
    return adj


def _settled(edges) -> bool:
    for u, ns in _adjacency(edges).items():
        smaller = [v for v in ns if v < u]
        if len(smaller) > 1 or (smaller and len(smaller) < len(ns)):
            return False
    return True


def _large_star(edges, _):
    out = set()
    for u, ns in _adjacency(edges).items():
        m = min(min(ns), u)
        out.update((v, m) for v in ns if v > u)
    return out


def _small_star(edges, _):
    out = set()
    for u, ns in _adjacency(edges).items():
        smaller = [v for v in ns if v < u]
        if smaller:
            m = min(smaller)
            out.update((v, m) for v in [*smaller, u] if v != m)
    return out


def _alternation(edges, number):
    return (_large_star if number % 2 else _small_star)(edges, number)


def _to_neighbourhood_min(edges, _):
    out = set()
    for u, ns in _adjacency(edges).items():
        m = min(min(ns), u)
        out.update((v, m) for v in [*ns, u] if v != m)
    return out


def rounds_to_settle(edges, step, cap: int = 1000) -> tuple[int, int]:
    """(star operations until the graph is a star forest, the most edges any round held)."""
    number, most = 0, len(edges)
    while not _settled(edges):
        number += 1
        edges = step(edges, number)
        most = max(most, len(edges))
        if number > cap:
            raise RuntimeError("did not settle")
    return number, most


def simulate(links_list) -> list[dict]:
    rows = []
    for links in links_list:
        order = list(range(links + 1))
        random.Random(links).shuffle(order)
        for name, edges in (("path order", [(i, i + 1) for i in range(links)]),
                            ("shuffled ids", [(order[i], order[i + 1]) for i in range(links)])):
            row = {"links": links, "ids": name}
            row["alternation_rounds"], row["alternation_most_edges"] = rounds_to_settle(edges, _alternation)
            if links <= 1000:  # its edges grow ~quadratically: 10,000 links do not fit in memory here
                row["neighbourhood_min_rounds"], row["neighbourhood_min_most_edges"] = rounds_to_settle(edges, _to_neighbourhood_min)
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--links", type=int, nargs="+", default=[10, 1000, 10000], help="chain lengths (default 10 1000 10000)")
    parser.add_argument("--shards", type=int, default=4, help="input shards (default 4)")
    parser.add_argument("--cores", type=int, default=2, help="threadpool workers (default 2)")
    parser.add_argument("--cluster", type=int, default=0, help="also one cluster of this many identical pages")
    parser.add_argument("--simulate", action="store_true", help="also the round operations in plain Python")
    parser.add_argument("--json", default=None, help="write every figure here")
    args = parser.parse_args()
    out = {"machine": machine(), "chains": chains(args)}
    if args.cluster:
        out["cluster"] = cluster(args)
    if args.simulate:
        out["simulated"] = simulate(args.links)
    print("| links | rounds | total s | signatures + buckets s | rounds s | per round s (mean, min-max) | last stage s | CPU s | "
          "union-find s | ratio |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    for r in out["chains"]:
        print(f"| {r['links']:,} | {r['rounds']} | {r['seconds']} | {r['signatures_and_buckets_s']} | {r['rounds_s']} | "
              f"{r['round_s_mean']} ({r['round_s_min']}-{r['round_s_max']}) | {r['last_stage_s']} | {r['cpu_s']} | "
              f"{r['union_find_s']} | {r['over_union_find']}x |")
    if "cluster" in out:
        c = out["cluster"]
        print(f"\ncluster of {c['members']:,}: {c['rounds']} rounds, {c['seconds']} s (signatures and buckets "
              f"{c['signatures_and_buckets_s']} s, rounds {c['rounds_s']} s, last stage {c['last_stage_s']} s), "
              f"peak RSS {c['peak_rss_mib']} MiB")
    if "simulated" in out:
        print("\n| links | ids | alternation: rounds, most edges | neighbourhood-to-min: rounds, most edges |")
        print("|---|---|---|---|")
        for r in out["simulated"]:
            other = (f"{r['neighbourhood_min_rounds']}, {r['neighbourhood_min_most_edges']:,}" if "neighbourhood_min_rounds" in r
                     else "not run (edges grow ~quadratically)")
            print(f"| {r['links']:,} | {r['ids']} | {r['alternation_rounds']}, {r['alternation_most_edges']:,} | {other} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
