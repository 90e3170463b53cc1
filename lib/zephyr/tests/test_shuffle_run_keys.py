"""Runs of a plain column key hold no key bytes: the reduce recomputes them from the payload.

The hash is narrowed to a few values here, so many different keys share each hash; outputs are
checked against a plain-Python oracle of the documented order (partition `h % n`, then hash,
then the key's bytes; a key's rows in input order), with and without skew splitting."""

import random
import zlib

import numpy as np
import orjson
import pyarrow as pa
import pytest

from zephyr import Dataset, col, counters, create_backend
from zephyr.shuffle import keys, run_keys
from zephyr.shuffle.columnar import FIELDS_META, JSON_DESCRIPTION
from zephyr.shuffle.slices import merge_slices

WEAK = 5  # distinct hashes


def weak_hash(kb: bytes) -> int:
    """A few hashes, spread over the partitions by an odd multiplier (the oracle's and the test's)."""
    return (zlib.crc32(kb) % WEAK + 1) * 0x9E3779B97F4A7C15 % (1 << 64)


@pytest.fixture
def narrow_hash(monkeypatch):
    """Every path hashes its key bytes in `keys.hash_keys`; count the rows whose key bytes are recomputed."""
    monkeypatch.setattr(keys, "hash_keys", lambda kb: np.array([weak_hash(k) for k in kb.to_list()], dtype=np.uint64))
    recomputed = []
    real = run_keys._key_values
    monkeypatch.setattr(run_keys, "_key_values", lambda data, rows: recomputed.append(len(rows)) or real(data, rows))
    return recomputed


def run(ds, tmp_path, name, memory="8MiB"):
    backend = create_backend("sync", progress=False, memory=memory, scratch_dir=str(tmp_path / f"scratch-{name}"))
    execution = backend.execute(ds)
    return list(execution), execution


def str_key_bytes(text: str) -> bytes:
    return b"s" + text.encode()  # the documented canonical bytes of a str key


def oracle_order(keys_in_input_order: list, num_partitions: int) -> list:
    """Distinct keys as the reduce hands them on: by partition, hash, key bytes."""
    ordered = []
    for p in range(num_partitions):
        mine = {k for k in keys_in_input_order if weak_hash(str_key_bytes(k)) % num_partitions == p}
        ordered += sorted(mine, key=lambda k: (weak_hash(str_key_bytes(k)), str_key_bytes(k)))
    return ordered


def assert_collisions(texts) -> None:
    by_hash = {}
    for t in set(texts):
        by_hash.setdefault(weak_hash(str_key_bytes(t)), set()).add(t)
    assert len(by_hash) == WEAK and min(map(len, by_hash.values())) > 10  # every hash holds many keys


def test_deduplicate_by_a_column_with_colliding_hashes_matches_the_oracle(narrow_hash, tmp_path):
    rng = random.Random(5)
    texts = [f"doc {i} " + "w" * rng.randint(50, 400) for i in range(400)]
    paths = []
    for shard in range(3):
        path = tmp_path / f"in-{shard}.jsonl"
        docs = [{"id": f"{shard}-{i}", "text": rng.choice(texts)} for i in range(1500)]
        path.write_bytes(b"".join(orjson.dumps(d) + b"\n" for d in docs))
        paths.append(path)
    lines = [line for p in paths for line in p.read_bytes().splitlines()]
    first = {}
    for line in lines:  # the oracle: the first line per text, in input order
        first.setdefault(orjson.loads(line)["text"], line)
    assert_collisions(first)
    out, execution = run(Dataset.from_files([str(p) for p in paths]).load_jsonl()
                         .deduplicate(col("text"), num_output_shards=3)
                         .write_jsonl(str(tmp_path / "out" / "part-{shard:05d}.jsonl")), tmp_path, "dedup")
    written = [line for p in sorted((tmp_path / "out").glob("*.jsonl")) for line in p.read_bytes().splitlines()]
    assert written == [first[t] for t in oracle_order(list(first), 3)]
    assert execution.counters["zephyr/shuffle_runs_columnar"] == execution.counters["zephyr/shuffle_runs"] >= 3
    assert sum(narrow_hash) > 0  # the reduce told colliding keys apart by recomputed key bytes


def group_records(n: int) -> list[dict]:
    """Records of 300 keys, 90% of them with keys of partition 1 of 4 (two of the five hashes)."""
    rng = random.Random(9)
    keys_ = [f"k{i}-" + "x" * rng.randint(0, 30) for i in range(300)]
    hot = [k for k in keys_ if weak_hash(str_key_bytes(k)) % 4 == 1]
    return [{"k": rng.choice(hot if rng.random() < 0.9 else keys_), "i": i, "pad": "p" * 40} for i in range(n)]


@pytest.mark.parametrize("skew", [False, True])
def test_group_by_a_column_with_colliding_hashes_matches_the_oracle_cut_or_not(narrow_hash, skew, monkeypatch, tmp_path):
    from zephyr.shuffle import runs

    if skew:  # any partition 4x the median is cut into key ranges; runs index 4 KiB batches
        monkeypatch.setenv("ZEPHYR_SKEW_MIN_BYTES", "1")
        monkeypatch.setattr(runs, "BATCH_BYTES", 4096)
    else:
        monkeypatch.setenv("ZEPHYR_SKEW_MAX_PIECES", "1")
    records = group_records(20_000)
    shards = [records[i::2] for i in range(2)]
    ds = Dataset.from_list(shards).flat_map(list).group_by(col("k"), lambda k, items: (k, [r["i"] for r in items]),
                                                              num_output_shards=4)
    out, execution = run(ds, tmp_path, f"group-{skew}")
    members = {}
    for shard in shards:  # the oracle: each key's records in input order (map shard, position)
        for r in shard:
            members.setdefault(r["k"], []).append(r["i"])
    assert_collisions(members)
    assert out == [(k, members[k]) for k in oracle_order(list(members), 4)]
    assert (execution.stats[1].num_shards > 4) == skew  # cut: partition 1 became key ranges
    assert sum(narrow_hash) > 0


def test_runs_of_a_column_key_are_smaller_than_of_a_python_key_and_give_the_same_output(tmp_path):
    records = group_records(5_000)
    outputs, written = [], []
    for name, key in (("column", col("k")), ("function", lambda r: r["k"])):
        ds = Dataset.from_list([records[:2500], records[2500:]]).flat_map(list).deduplicate(key, num_output_shards=2)
        out, execution = run(ds, tmp_path, name)
        outputs.append(out)
        written.append(execution.counters["zephyr/shuffle_bytes_written"])
    assert outputs[0] == outputs[1]
    kept_key_bytes = sum(1 + 8 + len(r["k"]) for r in {r["k"]: r for r in records}.values())  # tag, offset, text
    assert written[1] - written[0] >= kept_key_bytes * 0.9  # the function's runs carry every kept key's bytes


def test_group_by_a_column_sorted_by_a_value_with_colliding_hashes_matches_the_oracle(narrow_hash, tmp_path):
    records = group_records(6_000)
    shards = [records[i::2] for i in range(2)]
    ds = Dataset.from_list(shards).flat_map(list).group_by(col("k"), lambda k, items: (k, [r["i"] for r in items]),
                                                              sort_by=lambda r: r["i"] % 7, num_output_shards=4)
    out, _ = run(ds, tmp_path, "sorted")
    members = {}
    for shard in shards:  # the oracle: each key's records by sort value, then input order
        for r in shard:
            members.setdefault(r["k"], []).append(r["i"])
    assert out == [(k, sorted(members[k], key=lambda i: i % 7)) for k in oracle_order(list(members), 4)]
    assert sum(narrow_hash) > 0


def _runs_without_key_bytes(rows: list[tuple], sources: int, batch_rows: int) -> tuple[list, pa.Schema]:
    """`rows` (h, key, pos) dealt to `sources` runs as a map side writes them for `col("t")`:
    sorted by (h, key bytes, pos), no `kb` column, the key in each row's JSON line."""
    schema = pa.schema([("h", pa.uint64()), ("s", pa.int32()), ("pos", pa.int64()), ("j", pa.large_binary())],
                       metadata={FIELDS_META: orjson.dumps(JSON_DESCRIPTION), run_keys.KEY_META: b"t"})
    runs = []
    for s in range(sources):
        mine = sorted((r for i, r in enumerate(rows) if i % sources == s), key=lambda r: (r[0], str_key_bytes(r[1]), r[2]))
        runs.append([pa.RecordBatch.from_arrays([
            pa.array([r[0] for r in part], pa.uint64()), pa.array([s] * len(part), pa.int32()),
            pa.array([r[2] for r in part], pa.int64()),
            pa.array([orjson.dumps({"t": r[1], "pad": "x" * 900}) + b"\n" for r in part], pa.large_binary())], schema=schema)
            for part in (mine[at : at + batch_rows] for at in range(0, len(mine), batch_rows))])
    return runs, schema


def test_a_merge_of_runs_without_key_bytes_orders_collisions_by_key_and_starts_groups_even_in_the_fallback():
    rng = random.Random(3)
    hot = [(12345, f"hot{rng.randrange(40)}", pos) for pos in range(6000)]  # 6 MB under one hash, 40 keys
    cold = [(rng.randrange(1 << 63) | 1, f"cold{i}", 6000 + i) for i in range(3000)]
    runs, schema = _runs_without_key_bytes(hot + cold, sources=2, batch_rows=100)
    out, starts, previous = [], [], None
    with counters.collecting() as counts:
        for chunk in merge_slices([iter(r) for r in runs], schema, 2 * 1024 * 1024, sum(b.nbytes for r in runs for b in r)):
            starts += chunk.starts(previous).tolist()
            previous = chunk.last_key()
            table = chunk.table.take(pa.array(chunk.order))
            out += [(h, orjson.loads(j)["t"], s, pos) for h, j, s, pos in
                    zip(*(table.column(c).to_pylist() for c in ("h", "j", "s", "pos")))]
    expected = sorted(((h, key, s, pos) for s, batches in enumerate(runs) for b in batches
                       for h, key, pos in zip(b.column("h").to_pylist(), (orjson.loads(j)["t"] for j in b.column("j").to_pylist()),
                                              b.column("pos").to_pylist())),
                      key=lambda r: (r[0], str_key_bytes(r[1]), r[2], r[3]))
    assert out == expected
    assert starts == [i == 0 or expected[i][:2] != expected[i - 1][:2] for i in range(len(expected))]
    assert counts["zephyr/shuffle_slice_fallbacks"] == 1  # the batch-per-round merge took the hot hash
