"""deduplicate_fuzzy's connected components run as many rounds as the data needs (the run adds
one while the last found a document not yet in its cluster's star), within a budget.

The corpora make the candidate graph exact: with word 1-grams, documents that share a word have
Jaccard >= 1/3 and documents that share none have 0; with 200 bands of 2 rows a pair at 1/3
shares a bucket with probability 1 - (8/9)**200 (1 - 6e-11) and a pair at 0 never (band keys
are 64 bits of two MinHash values). So the clusters are the connected components of "shares a
word", which the oracle here finds with its own union-find over an inverted index.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
from collections import defaultdict
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, NotConvergedError, create_backend
from zephyr.dedup import components as cc

EXACT = {"ngram": 1, "num_perms": 400, "bands": 200}  # see the module docstring


# ---- the oracle --------------------------------------------------------------------------------

def union_find_kept(shards: list[list[dict]]) -> dict:
    """Each document's kept document, as [shard, position]: the first, by (shard, position), of
    its component of "shares a word", by union-find over an inverted index of the words."""
    order = [(s, p) for s, shard in enumerate(shards) for p in range(len(shard))]
    parent = {sp: sp for sp in order}

    def find(x):
        while parent[x] != x:
            parent[x] = parent[parent[x]]
            x = parent[x]
        return x

    holders = defaultdict(list)
    for s, p in order:
        for word in set(shards[s][p]["text"].lower().split()):
            holders[word].append((s, p))
    for docs in holders.values():
        for other in docs[1:]:
            a, b = find(docs[0]), find(other)
            parent[max(a, b)] = min(a, b)
    return {shards[s][p]["id"]: list(find((s, p))) for s, p in order}  # the smallest (shard, position) is the root


# ---- corpora -----------------------------------------------------------------------------------

def chain_docs(links: int, prefix: str = "c") -> list[dict]:
    """`links` + 1 documents in a path: document i holds node i's words and node i + 1's."""
    def words(i):
        return f"{prefix}{i}a {prefix}{i}b {prefix}{i}c"
    return [{"id": f"{prefix}{i}", "text": f"{words(i)} {words(i + 1)}"} for i in range(links + 1)]


def in_shards(docs: list[dict], num_shards: int) -> list[list[dict]]:
    size = -(-len(docs) // num_shards)
    return [docs[k * size : (k + 1) * size] for k in range(num_shards)]


def _dataset(shards):
    return Dataset.from_list(shards).flat_map(_identity)


def _identity(shard):
    return shard


def _text(record):
    return record["text"]


def _round_stages(execution) -> list:
    return [s for s in execution.stats if "round " in s.description]


def _run_annotated(backend, shards, **options):
    execution = backend.execute(_dataset(shards).deduplicate_fuzzy(_text, annotate=True, **EXACT, **options))
    return {r["id"]: r["fuzzy_kept"] for r in execution}, execution


# ---- as many rounds as the data needs ------------------------------------------------------------

def test_a_chain_needs_more_rounds_than_the_old_fixed_four_and_gets_them(local_backend):
    """Regression: 4 rounds, fixed, failed with NotConvergedError on chains longer than ~100."""
    shards = in_shards(chain_docs(200) + [{"id": "alone", "text": "nothing shared here"}], 3)
    got, execution = _run_annotated(local_backend, shards)
    assert got == union_find_kept(shards)
    rounds = _round_stages(execution)
    assert len(rounds) > 4 and execution.counters["zephyr/cc_rounds"] == len(rounds)
    assert execution.counters["zephyr/cc_rounds"] == len([s for s in execution.status.snapshot()["stages"] if "round " in s["description"]])


def test_a_chain_after_an_exact_dedup_gets_its_rounds_on_wide_ids(local_backend):
    """After a shuffle a document's id is wide (its origin, then its place in the signature
    stage): the rounds settle on those as on narrow ones. Oracle: the exact copies (later in the
    input) go, and the clusters are the chain and the lone document."""
    chain = chain_docs(200)
    copies = [{"id": f"copy{i}", "text": chain[i]["text"]} for i in range(0, 200, 7)]
    shards = in_shards(chain + [{"id": "alone", "text": "nothing shared here"}] + copies, 3)
    execution = local_backend.execute(_dataset(shards).deduplicate(_text).deduplicate_fuzzy(_text, annotate=True, **EXACT))
    got = {r["id"]: tuple(r["fuzzy_kept"]) for r in execution}
    assert set(got) == {d["id"] for d in chain} | {"alone"}
    clusters = defaultdict(set)
    for doc_id, kept in got.items():
        clusters[kept].add(doc_id)
    assert sorted(map(sorted, clusters.values())) == sorted([sorted(d["id"] for d in chain), ["alone"]])
    assert execution.counters["zephyr/cc_rounds"] > 4


@pytest.mark.slow
def test_a_10000_link_chain_finishes_with_the_right_components(local_backend):
    """The chain's documents in path order (ids ascending along it: the slowest order measured)."""
    others = chain_docs(30, prefix="o") + [{"id": f"s{i}", "text": f"single{i} words{i}"} for i in range(50)]
    shards = in_shards(chain_docs(10_000) + others, 4)
    got, execution = _run_annotated(local_backend, shards)
    assert got == union_find_kept(shards)
    assert {tuple(v) for k, v in got.items() if k.startswith("c")} == {(0, 0)}  # one cluster, 10,001 documents
    assert len(_round_stages(execution)) == execution.counters["zephyr/cc_rounds"] > 20


@pytest.mark.slow
def test_a_30000_member_cluster_finishes_with_the_right_components(local_backend):
    """One cluster of 30,000 identical pages over 4 shards (a node of degree 30,000 in the rounds)
    and distinct pages. Not 10^6: that takes minutes here (benchmarks/README.md section 24, run
    with `bench_cc_rounds.py --cluster 1000000`). Pairs are at Jaccard 1 or 0, so any banding
    finds exactly "shares a word"."""
    members = 30_000
    page = "the same boilerplate page in every shard"
    docs = [{"id": i, "text": page} for i in range(members)] + [{"id": f"u{i}", "text": f"u{i}x u{i}y"} for i in range(20)]
    random.Random(2).shuffle(docs)
    shards = in_shards(docs, 4)
    execution = local_backend.execute(_dataset(shards).deduplicate_fuzzy(_text, annotate=True))
    got = {r["id"]: r["fuzzy_kept"] for r in execution}
    assert got == union_find_kept(shards)
    assert len({tuple(v) for k, v in got.items() if isinstance(k, int)}) == 1
    assert execution.counters["zephyr/cc_rounds"] == len(_round_stages(execution))


def test_a_budget_too_small_fails_naming_it_and_a_rerun_with_more_reuses_the_rounds(tmp_path):
    shards = in_shards(chain_docs(60), 2)
    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch"))
    out = f"{tmp_path}/out/{{shard}}.jsonl"
    pipeline = _dataset(shards).deduplicate_fuzzy(_text, annotate=True, **EXACT, cc_rounds=3)
    failed = backend.execute(pipeline.write_jsonl(out))
    with pytest.raises(NotConvergedError, match=r"cc_rounds=3 rounds .*rerun with a larger cc_rounds"):
        list(failed)
    assert len(_round_stages(failed)) == 3  # exactly the budget ran
    assert sum(s.retries_user for s in failed.stats) == 0
    rerun = backend.execute(_dataset(shards).deduplicate_fuzzy(_text, annotate=True, **EXACT, cc_rounds=64).write_jsonl(out))
    list(rerun)
    # the signature and bucket stages and the 3 rounds: every map shard of theirs reused
    assert rerun.counters["zephyr/map_shards_resumed"] == 2 * (2 + 3)
    got = {r["id"]: r["fuzzy_kept"] for f in sorted((tmp_path / "out").glob("*.jsonl")) for r in map(json.loads, f.read_text().splitlines())}
    assert got == union_find_kept(shards)


@pytest.mark.parametrize("bad", [0, -1, 2.0, True])
def test_cc_rounds_must_be_a_positive_integer(bad):
    with pytest.raises(ValueError, match="cc_rounds .* must be a positive integer or None"):
        Dataset.from_list([1]).deduplicate_fuzzy(_text, cc_rounds=bad)


def test_the_plan_shows_round_1_and_the_budget():
    plan = Dataset.from_list([[{"text": "a"}]]).flat_map(_identity).deduplicate_fuzzy(_text).plan()
    text = plan.describe()
    assert "round 1: group_by(node_of, large_star" in text
    assert "another while zephyr/cc_unsettled > 0, at most 128" in text
    assert len(plan.stages) == 4  # signatures, buckets, round 1, apply: later rounds are added as the run goes


# ---- the rounds on their own: random graphs against union-find ------------------------------------

def _rounds_in_plain_python(edges: list[tuple[int, int]], max_rounds: int = 200) -> tuple[dict, int]:
    """Run the star reducers as the shuffle would (grouped by node_of, sorted by sort_key) until a
    round counts nothing unsettled; its labels, and the rounds run."""
    from zephyr import counters

    items = [item for u, v in edges for item in ((cc.EDGE, u, v), (cc.EDGE, v, u))]
    for number in range(1, max_rounds + 1):
        groups = defaultdict(list)
        for item in items:
            groups[cc.node_of(item)].append(item)
        reducer = cc.STAR_REDUCERS[(number - 1) % 2]
        with counters.collecting() as counts:
            items = [out for key in sorted(groups, key=repr) for out in reducer(key, iter(sorted(groups[key], key=cc.sort_key)))]
        if not counts.get(cc.UNSETTLED):
            return {item[2]: item[3] for item in items if item[0] == cc.LABEL}, number
    raise AssertionError("did not settle")


def _components(nodes: set[int], edges: list[tuple[int, int]]) -> dict:
    parent = {n: n for n in nodes}

    def find(x):
        while parent[x] != x:
            x = parent[x]
        return x

    for u, v in edges:
        a, b = find(u), find(v)
        parent[max(a, b)] = min(a, b)
    return {n: find(n) for n in nodes}


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 40), st.integers(0, 40)).filter(lambda e: e[0] != e[1]), max_size=80))
def test_property_the_rounds_settle_on_the_components_of_any_graph(edges):
    """Every node with a smaller member in its component gets that component's smallest node as
    its label once a round counts nothing unsettled; the others get none."""
    labels, _ = _rounds_in_plain_python(edges)
    nodes = {n for e in edges for n in e}
    want = {n: root for n, root in _components(nodes, edges).items() if root != n}
    assert labels == want


def test_a_settled_star_forest_counts_nothing_and_an_unsettled_node_counts():
    from zephyr import counters

    star = [(0, 5), (0, 7), (3, 9)]
    items = [item for u, v in star for item in ((cc.EDGE, u, v), (cc.EDGE, v, u))]
    for reducer in cc.STAR_REDUCERS:
        with counters.collecting() as counts:
            for node in (0, 5, 7, 3, 9):
                list(reducer(node, iter(sorted((i for i in items if i[1] == node), key=cc.sort_key))))
        assert not counts.get(cc.UNSETTLED)
    with counters.collecting() as counts:  # 5 has a smaller neighbour (0) and a larger (8)
        list(cc.large_star(5, iter([(cc.EDGE, 5, 0), (cc.EDGE, 5, 8)])))
    assert counts[cc.UNSETTLED] == 1


# ---- resume after the driver is killed mid-rounds ---------------------------------------------------

DRIVER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[3])
    from test_fuzzy_rounds import EXACT, _dataset, _text, chain_docs, in_shards
    from zephyr import create_backend

    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[1])
    pipeline = _dataset(in_shards(chain_docs(int(sys.argv[4])), 2)).deduplicate_fuzzy(_text, annotate=True, **EXACT)
    execution = backend.execute(pipeline.write_jsonl(sys.argv[2] + "/{shard}.jsonl"))
    list(execution)
    print(json.dumps(dict(execution.counters)))
    """
)


def _roots(scratch: Path) -> list[Path]:
    """Scratch roots that a stage has started (each has its owner marker)."""
    return [p for p in scratch.iterdir() if (p / "owner.json").exists()] if scratch.exists() else []


@pytest.mark.slow
def test_a_driver_killed_mid_rounds_resumes_at_its_round_and_writes_what_an_uninterrupted_run_writes(
    tmp_path, background, wait_until
):
    """Each run is a driver process of its own (the same script: the same fingerprints)."""
    links = 2_000  # about 22 rounds
    scratch, out, clean = tmp_path / "scratch", tmp_path / "out", tmp_path / "clean"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}

    def driver(scratch_dir: Path, out_dir: Path) -> subprocess.Popen:
        args = [sys.executable, "-c", DRIVER, str(scratch_dir), str(out_dir), str(Path(__file__).parent), str(links)]
        return background(args, env=env, stdout=subprocess.PIPE, text=True)

    killed = driver(scratch, out)
    wait_until(lambda: len(_roots(scratch)) >= 2 + 6 or killed.poll() is not None, "the driver to start round 6")
    killed.send_signal(signal.SIGKILL)
    assert killed.wait() == -signal.SIGKILL  # killed, not finished
    assert not list(out.glob("*.jsonl"))
    started = len(_roots(scratch))
    assert started >= 8

    resumed, uninterrupted = driver(scratch, out), driver(tmp_path / "other", clean)
    counters = [json.loads(proc.communicate(timeout=600)[0].splitlines()[-1]) for proc in (resumed, uninterrupted)]
    assert resumed.returncode == uninterrupted.returncode == 0

    # every stage but the one the kill cut short was reused whole (2 map shards each)
    assert counters[0]["zephyr/map_shards_resumed"] >= 2 * (started - 1)
    assert "zephyr/map_shards_resumed" not in counters[1]
    assert counters[0]["zephyr/cc_rounds"] == counters[1]["zephyr/cc_rounds"] > 6
    outputs = sorted(p.name for p in clean.glob("*.jsonl"))
    assert outputs and outputs == sorted(p.name for p in out.glob("*.jsonl"))
    for name in outputs:
        assert (out / name).read_bytes() == (clean / name).read_bytes()
    got = {r["id"]: r["fuzzy_kept"] for name in outputs for r in map(json.loads, (out / name).read_text().splitlines())}
    assert got == union_find_kept(in_shards(chain_docs(links), 2))
    assert not _roots(scratch)  # the finished run removed its scratch, rounds included
