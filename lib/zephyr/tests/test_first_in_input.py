""""The first" means the first in the pipeline's input, after any number of shuffles (issue 38).

`deduplicate` and `deduplicate_fuzzy` keep, and a group's reducer sees its items in, the order of
the *input*: by input shard (file), then position. Before the origin of each item was carried
through shuffles, a dedup that read another shuffle's output kept the first in that shuffle's
(hash) order: in a new user's run, 1,662 of the removed documents had no earlier copy in file
order. Each test checks against a plain-Python model of the input in file order.
"""

from __future__ import annotations

import json
import os
import pathlib
import random

import pytest

from lib.zephyr.tests.test_fuzzy_dedup import oracle_keep
from zephyr import Dataset, create_backend
from zephyr.context import IntraShardExecution, ResourceConfig, ZephyrContext
from zephyr.runners import SubprocessRunner

VOCAB = [f"w{i}" for i in range(20_000)]


def _text(record):
    return record["text"]


def _key(record):
    return record["k"]


def _identity(shard):
    return shard


def near_copy_corpus(seed: int, num_shards: int = 4, docs: int = 240) -> list[list[dict]]:
    """Originals (120 words), exact copies, near copies (1 word edited: Jaccard ~0.92, so copies
    of one original are near each other too) and unrelated documents, spread over the shards at
    random: every cluster has members in several shards, in no particular order."""
    rng = random.Random(seed)
    originals = [[rng.choice(VOCAB) for _ in range(120)] for _ in range(docs // 6)]
    shards: list[list[dict]] = [[] for _ in range(num_shards)]
    for i in range(docs):
        words = list(rng.choice(originals))
        kind = rng.random()
        if kind < 0.35:
            words[rng.randrange(len(words))] = rng.choice(VOCAB)
        elif kind > 0.75:
            words = [rng.choice(VOCAB) for _ in range(120)]
        shards[rng.randrange(num_shards)].append({"id": i, "text": " ".join(words)})
    return shards


def write_shards(tmp_path, shards: list[list[dict]]) -> str:
    for s, records in enumerate(shards):
        (tmp_path / f"in-{s:02d}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
    return str(tmp_path / "in-*.jsonl")


def first_per_key(shards: list[list], key) -> list:
    """The model: the first record of each key, by (shard, position)."""
    seen, firsts = set(), []
    for record in (r for shard in shards for r in shard):
        if key(record) not in seen:
            seen.add(key(record))
            firsts.append(record)
    return firsts


def ids(records) -> list:
    return sorted(r["id"] for r in records)


@pytest.mark.parametrize("seed", [0, 1])
def test_fuzzy_dedup_after_an_exact_dedup_keeps_the_first_of_each_cluster_in_file_order(backend, tmp_path, seed):
    shards = near_copy_corpus(seed)
    exact = [[r for r in shard if r in first_per_key(shards, _text)] for shard in shards]
    want, rep = oracle_keep(exact)  # all-pairs Jaccard and union-find over the input in file order
    ds = Dataset.from_files(write_shards(tmp_path, shards)).load_jsonl().deduplicate(_text).deduplicate_fuzzy(_text)
    got = list(backend.execute(ds))
    assert ids(got) == ids(want)
    order = {r["id"]: (s, p) for s, shard in enumerate(shards) for p, r in enumerate(shard)}
    kept = {r["id"] for r in got}
    for s, shard in enumerate(exact):  # and so: every removed document has an earlier kept one in its cluster
        for p, r in enumerate(shard):
            first = exact[rep[(s, p)][0]][rep[(s, p)][1]]
            assert first["id"] in kept and order[first["id"]] <= order[r["id"]]


def test_fuzzy_annotate_after_a_shuffle_names_the_kept_document_by_its_place_in_the_input(local_backend, tmp_path):
    shards = near_copy_corpus(2, num_shards=3)
    _, rep = oracle_keep(shards)
    ds = Dataset.from_files(write_shards(tmp_path, shards)).load_jsonl().reshard(2).deduplicate_fuzzy(_text, annotate=True)
    got = {r["id"]: r for r in local_backend.execute(ds)}
    assert len(got) == sum(map(len, shards))
    for s, shard in enumerate(shards):
        for p, r in enumerate(shard):
            assert got[r["id"]]["fuzzy_kept"] == list(rep[(s, p)]), r["id"]
    clusters = {}
    for r in got.values():
        clusters.setdefault(r["fuzzy_cluster"], set()).add(tuple(r["fuzzy_kept"]))
    assert all(len(kept) == 1 for kept in clusters.values())  # one cluster id per kept document


def keyed_shards(seed: int, num_shards: int = 5, n: int = 600, keys: int = 40) -> list[list[dict]]:
    rng = random.Random(seed)
    shards: list[list[dict]] = [[] for _ in range(num_shards)]
    for i in range(n):
        shards[rng.randrange(num_shards)].append({"id": i, "k": rng.randrange(keys), "j": rng.randrange(7)})
    return shards


PAYLOADS = {
    "json": lambda r: r,  # dicts of JSON data: JSON lines through the shuffle
    "fields": lambda r: {**r, "t": (r["id"],)},  # a tuple field: one Arrow column per field
    "pickled": lambda r: (r["k"], r["id"], r["j"]),  # tuples: pickled records
}


@pytest.mark.parametrize("payload", list(PAYLOADS))
def test_exact_dedup_after_a_reshard_keeps_the_first_in_input_order(backend, payload):
    shards = [[PAYLOADS[payload](r) for r in shard] for shard in keyed_shards(3)]
    key = (lambda r: r[0]) if payload == "pickled" else _key
    ds = Dataset.from_list(shards).flat_map(_identity).reshard(3).deduplicate(key)
    assert sorted(map(repr, backend.execute(ds))) == sorted(map(repr, first_per_key(shards, key)))


def test_exact_dedup_after_a_reshard_with_many_spilled_runs_and_the_pickled_path(tmp_path, monkeypatch):
    """Small buffers: many runs per map shard, merged in passes, on both the columnar and the
    pickled path (the sort falls back to origin order where a buffer's rows arrive out of it)."""
    shards = [[{**r, "pad": "x" * 300} for r in shard] for shard in keyed_shards(4, n=12_000, keys=900)]
    want = first_per_key(shards, _key)
    for columnar in ("1", "0"):
        monkeypatch.setenv("ZEPHYR_SHUFFLE_COLUMNAR", columnar)
        backend = create_backend("sync", progress=False, memory="4MiB", scratch_dir=str(tmp_path / f"scratch-{columnar}"))
        ds = Dataset.from_list(shards).flat_map(_identity).reshard(4).deduplicate(_key, num_output_shards=3)
        execution = backend.execute(ds)
        got = list(execution)
        assert ids(got) == ids(want), f"ZEPHYR_SHUFFLE_COLUMNAR={columnar}"
        assert execution.counters["zephyr/shuffle_runs"] > 10 and execution.counters["zephyr/merge_passes"] > 0


def test_a_second_dedup_keeps_the_first_in_input_order_not_the_first_dedups_output_order(backend):
    shards = keyed_shards(5)
    ds = Dataset.from_list(shards).flat_map(_identity).deduplicate(lambda r: (r["k"], r["j"])).deduplicate(_key)
    after_first = [first_per_key(shards, lambda r: (r["k"], r["j"]))]
    assert ids(backend.execute(ds)) == ids(first_per_key(after_first, _key))


def _ids_of_group(key, items):
    return (key, [r["id"] for r in items])


def test_a_group_sees_its_items_in_input_order_after_a_shuffle(backend):
    shards = keyed_shards(6)
    ds = Dataset.from_list(shards).flat_map(_identity).reshard(4).group_by(_key, _ids_of_group)
    want = {}
    for r in (r for shard in shards for r in shard):
        want.setdefault(r["k"], []).append(r["id"])
    assert dict(backend.execute(ds)) == want


def _group_first(key, items):
    return {"id": next(items)["id"], "k": key % 7}


def test_a_reducers_outputs_go_on_with_their_groups_first_item_as_origin(local_backend):
    """group_by -> deduplicate: of two groups' outputs with one key, the one whose group's first
    item came first in the input is kept."""
    shards = keyed_shards(7)
    ds = Dataset.from_list(shards).flat_map(_identity).group_by(_key, _group_first).deduplicate(_key)
    firsts = {}  # in the order of each group's first item in the input
    for r in (r for shard in shards for r in shard):
        firsts.setdefault(r["k"], r["id"])
    want = first_per_key([[{"id": first, "k": k % 7} for k, first in firsts.items()]], _key)
    assert ids(local_backend.execute(ds)) == ids(want)


def _with_pid(record):
    return {**record, "pid": os.getpid()}


def _task_pid(records):
    return ({**r, "task": os.getpid()} for r in records)


def test_a_split_stage_between_two_shuffles_keeps_the_origins(tmp_path):
    """A stage whose per-item ops run in several processes (intra-shard execution) reads its
    shuffle ahead in a thread of its own: its items still go on with their own origins."""
    shards = keyed_shards(8, n=3000)
    ctx = ZephyrContext(client="sync", max_workers=2, resources=ResourceConfig(cpu=1, ram="512m"),
                        intra_shard_execution=IntraShardExecution.AUTO, stage_runner_factory=SubprocessRunner,
                        chunk_storage_prefix=str(tmp_path / "chunks"))
    try:  # one shard read in hash order, its map split, then the dedup that must see the input order
        ds = (Dataset.from_list(shards).flat_map(_identity).deduplicate(lambda r: (r["k"], r["j"]), num_output_shards=1)
              .map(_with_pid).map_shard(_task_pid).deduplicate(_key))
        got = ctx.execute(ds).results
    finally:
        ctx.shutdown()
    assert all(r["pid"] != r["task"] for r in got)  # the map ran in the chunk processes
    assert ids(got) == ids(first_per_key([first_per_key(shards, lambda r: (r["k"], r["j"]))], _key))


def test_reruns_after_two_shuffles_write_the_same_bytes(tmp_path):
    shards = near_copy_corpus(9, num_shards=3, docs=120)
    source = write_shards(tmp_path, shards)
    outputs = []
    for run, name in enumerate(["sync", "threadpool", "sync"]):
        out = tmp_path / f"out-{run}"
        ds = (Dataset.from_files(source).load_jsonl().reshard(3).deduplicate(_text).deduplicate_fuzzy(_text)
              .write_jsonl(str(out / "part-{shard}.jsonl")))
        list(create_backend(name, progress=False, max_parallelism=3).execute(ds))
        outputs.append({p.name: p.read_bytes() for p in sorted(out.glob("part-*"))})
    assert outputs[0] == outputs[1] == outputs[2] and sum(map(len, outputs[0].values())) > 0


def test_records_of_files_loaded_after_a_shuffle_on_the_batch_path_keep_the_files_order(local_backend, tmp_path):
    """Paths shuffled, then read on the Arrow batch path (`load_jsonl` and a column filter):
    each record's origin is its path's, and records of one file keep their line order."""
    from zephyr import col

    shards = keyed_shards(10, num_shards=6, keys=300)  # most keys twice: their first copies in any file
    paths = []
    for s, records in enumerate(shards):
        paths.append(str(tmp_path / f"part-{s}.jsonl"))
        pathlib.Path(paths[-1]).write_text("".join(json.dumps(r) + "\n" for r in records))
    # a shuffle of the paths (one shard, in hash order), then the batch path, then the dedup
    ds = Dataset.from_list(paths).deduplicate(str, num_output_shards=1).load_jsonl().filter(col("k") >= 0).deduplicate(col("k"))
    assert ids(local_backend.execute(ds)) == ids(first_per_key(shards, _key))


def _halves(record):
    words = record["text"].split()
    return [{"id": f"{record['id']}-{h}", "text": " ".join(words[h * 60 : (h + 1) * 60])} for h in (0, 1)]


def test_annotated_clusters_of_items_made_from_one_item_after_a_shuffle_keep_distinct_ids(local_backend):
    """Two halves of one document, split after a shuffle, share that document's origin; in
    different clusters they still get different cluster ids (and its place as the kept one's)."""
    shards = near_copy_corpus(14, num_shards=3, docs=150)
    halves = [[h for r in shard for h in _halves(r)] for shard in shards]  # siblings in order, as made
    _, rep = oracle_keep(halves)
    want = {}
    for (s, p), first in rep.items():
        want.setdefault(first, set()).add(halves[s][p]["id"])
    ds = Dataset.from_list(shards).flat_map(_identity).reshard(2).flat_map(_halves).deduplicate_fuzzy(_text, annotate=True)
    got_records = list(local_backend.execute(ds))
    got = {}
    for r in got_records:
        got.setdefault(r["fuzzy_cluster"], set()).add(r["id"])
    assert sorted(map(sorted, got.values())) == sorted(map(sorted, want.values()))
    for r in got_records:  # the kept one's document's place in the input: its shard, position // 2
        first = next(f for f, members in want.items() if r["id"] in members)
        assert r["fuzzy_kept"] == [first[0], first[1] // 2]
