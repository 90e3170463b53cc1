"""The reduce side's merge in hash-range slices (`zephyr.shuffle.slices`): the same rows in the
same order as a plain sort (the oracle), no key split across slices, forced hash collisions,
the fallback for one hash's rows larger than a source's share, and a deduplicate whose
partition is many times the slice budget against a plain-Python "first in the input"."""

import random
import zlib

import numpy as np
import orjson
import pyarrow as pa
import pytest
from zephyr import Dataset, col, counters, create_backend
from zephyr.shuffle.slices import merge_slices

SCHEMA = pa.schema([("h", pa.uint64()), ("kb", pa.large_binary()), ("s", pa.int32()), ("pos", pa.int64()), ("j", pa.large_binary())])


def _runs(rows: list[tuple], sources: int, batch_rows: int) -> list[list[pa.RecordBatch]]:
    """`rows` (h, kb, pos, payload) dealt to `sources` runs, each sorted by (h, kb, pos) as a map side writes them."""
    runs = []
    for s in range(sources):
        mine = sorted((r for i, r in enumerate(rows) if i % sources == s), key=lambda r: (r[0], r[1], r[2]))
        batches = []
        for at in range(0, len(mine), batch_rows):
            part = mine[at : at + batch_rows]
            batches.append(pa.RecordBatch.from_arrays([
                pa.array([r[0] for r in part], pa.uint64()), pa.array([r[1] for r in part], pa.large_binary()),
                pa.array([s] * len(part), pa.int32()), pa.array([r[2] for r in part], pa.int64()),
                pa.array([r[3] for r in part], pa.large_binary())], schema=SCHEMA))
        runs.append(batches)
    return runs


def _merged(runs: list[list[pa.RecordBatch]], budget: int) -> tuple[list[tuple], list[set]]:
    """The rows `merge_slices` hands on, in order, and the hashes of each slice."""
    out, hashes = [], []
    with counters.collecting() as counts:
        total = sum(b.nbytes for r in runs for b in r)
        for chunk in merge_slices([iter(r) for r in runs], SCHEMA, budget, total):
            table = chunk.table.take(pa.array(chunk.order))
            out += list(zip(*(table.column(c).to_pylist() for c in ("h", "kb", "s", "pos"))))
            hashes.append(set(table.column("h").to_pylist()))
    return out, hashes, counts


def _oracle(runs: list[list[pa.RecordBatch]]) -> list[tuple]:
    rows = [r for batches in runs for b in batches for r in zip(*(b.column(c).to_pylist() for c in ("h", "kb", "s", "pos")))]
    return sorted(rows)


@pytest.mark.parametrize("spread", [1 << 58, 1_000_003], ids=["uniform", "dense"])
def test_slices_give_the_sorted_rows_and_never_split_a_hash_even_with_collisions(spread):
    """`uniform`: the hashes span the hash space, slices are cut at targets; `dense`: they all
    lie low in it, and the read-ahead's cap cuts them."""
    rng = random.Random(7)
    keys = [b"s" + bytes(rng.choice(b"abcdef") for _ in range(rng.randint(1, 6))) for _ in range(400)]
    # a weak hash: 64 values for 400 keys, so most hashes are shared by different key bytes
    rows = [(zlib.crc32(k) % 64 * spread, k, pos, b"x" * rng.randint(500, 1500)) for pos, k in enumerate(rng.choices(keys, k=12_000))]
    runs = _runs(rows, sources=4, batch_rows=200)
    out, hashes, counts = _merged(runs, budget=4 * 1024 * 1024)
    assert out == _oracle(runs)
    assert counts["zephyr/shuffle_slices"] >= 2  # 12 MB in slices of about 4 MiB: really sliced
    assert sum(map(len, hashes)) == len(set().union(*hashes))  # no hash in two slices
    assert not counts.get("zephyr/shuffle_slice_fallbacks")


def test_a_hash_group_larger_than_a_source_share_falls_back_and_says_so():
    rng = random.Random(3)
    hot = [(12345, b"s" + str(rng.randrange(50)).encode(), pos, b"y" * 1000) for pos in range(6000)]  # 6 MB, one hash
    cold = [(rng.randrange(1 << 63), b"s" + str(i).encode(), 6000 + i, b"z" * 100) for i in range(3000)]
    runs = _runs(hot + cold, sources=2, batch_rows=100)
    out, _, counts = _merged(runs, budget=2 * 1024 * 1024)
    assert out == _oracle(runs)
    assert counts["zephyr/shuffle_slice_fallbacks"] == 1


def path_lines(path) -> list[bytes]:
    with open(path, "rb") as f:
        return f.read().splitlines()


def _weak_hash(kb, hashed: list) -> np.ndarray:
    """16 distinct hashes: different texts collide all the time."""
    hashed.append(len(kb))
    return np.array([zlib.crc32(k) % 16 << 40 for k in kb.to_list()], dtype=np.uint64)


def test_deduplicate_of_a_partition_many_times_the_slice_budget_keeps_the_first_in_input(monkeypatch, tmp_path):
    from zephyr.shuffle import keys

    hashed: list[int] = []
    monkeypatch.setattr(keys, "hash_keys", lambda kb: _weak_hash(kb, hashed))  # every path hashes its keys there
    rng = random.Random(11)
    texts = [f"doc {i} " + "w" * rng.randint(200, 2000) for i in range(1500)]
    paths = []
    for shard in range(3):
        path = tmp_path / f"in-{shard}.jsonl"
        docs = [{"id": f"{shard}-{i}", "text": rng.choice(texts)} for i in range(2500)]
        path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
        paths.append(str(path))
    seen, expected = set(), []
    for path in paths:  # the oracle: the first document per text, in the input's order
        for line in path_lines(path):
            doc = orjson.loads(line)
            if doc["text"] not in seen:
                seen.add(doc["text"])
                expected.append(doc["id"])
    backend = create_backend("sync", progress=False, memory="8MiB", scratch_dir=str(tmp_path / "scratch"))
    out_dir = tmp_path / "out"
    execution = backend.execute(Dataset.from_files(paths).load_jsonl().deduplicate(col("text"), num_output_shards=2)
                                .write_jsonl(str(out_dir / "part-{shard:05d}.jsonl")))
    list(execution)
    kept = [orjson.loads(line)["id"] for p in sorted(out_dir.glob("*.jsonl")) for line in path_lines(p)]
    assert sorted(kept) == sorted(expected)
    assert sum(hashed) == 3 * 2500  # every key took the weak hash
    assert execution.counters["zephyr/shuffle_slices"] > 4  # ~10 MB of runs in 1 MiB slices
    assert execution.counters["zephyr/shuffle_runs"] > 3
