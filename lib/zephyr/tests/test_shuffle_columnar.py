"""The columnar (Arrow) shuffle path: exact round trips, the pickled fallback, equality with the
pickled path, skew splitting by key range, and resuming from columnar runs."""

import os
import pickle
import random
import subprocess
import sys
import textwrap

import pytest

from zephyr import Dataset, create_backend
from zephyr.shuffle.columnar import columns_of, key_column, records_of
from zephyr.execution.summary import format_summary
from zephyr.shuffle.keys import key_bytes, partition_of
from hypothesis import given, settings
from hypothesis import strategies as st


def typed(value):
    """A comparable form that keeps types and float bits: 1 != 1.0, (1,) != [1], nan == nan."""
    return pickle.dumps(value, protocol=5)


def run(ds, monkeypatch, tmp_path, columnar=True, memory="4MiB", **env):
    monkeypatch.setenv("ZEPHYR_SHUFFLE_COLUMNAR", "1" if columnar else "0")
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    backend = create_backend("sync", progress=False, memory=memory, scratch_dir=str(tmp_path / f"s-{columnar}-{len(env)}"))
    execution = backend.execute(ds)
    return list(execution), execution


# ---- round trips, record by record -----------------------------------------------------------------

EXACT_CASES = [
    [{"a": 1}, {"a": 2}],
    [{"a": 1.0}, {"a": -0.0}, {"a": float("nan")}, {"a": float("inf")}],
    [{"a": 1}, {"a": 1.0}],  # int mixed with float: must not become two floats
    [{"a": (1, 2)}, {"a": [1, 2]}],  # tuple vs list
    [{"a": None}, {"a": "x"}],
    [{"a": None}, {"a": None}],
    [{"a": True}, {"a": 1}],  # bool vs int
    [{"a": 2**70}, {"a": -(2**63)}],  # beyond 64 bits
    [{"a": "\ud800"}, {"a": "ok"}],  # a lone surrogate
    [{"a": b"bytes"}, {"a": {"nested": [1, {"x": None}]}}],
    [{"b": 1, "a": 2}, {"b": 3, "a": 4}],  # key order kept
    [{"a": "é" * 100_000}, {"a": "日本"}],
]


@pytest.mark.parametrize("records", EXACT_CASES, ids=range(len(EXACT_CASES)))
def test_columns_round_trip_exactly(records):
    columns, description = columns_of(records)
    assert [typed(r) for r in records_of(columns, description)] == [typed(r) for r in records]


@pytest.mark.parametrize("records", [[1, 2], [{"a": 1}, {"b": 1}], [{"a": 1}, {"a": 1, "b": 2}], [{"a": 1, "b": 2}, {"b": 2, "a": 1}], [{1: "x"}, {1: "y"}], [{}, {}],
                                     [{"\ud800": 1}, {"\ud800": 2}]])
def test_records_that_are_not_uniform_dicts_are_not_columnar(records):
    assert columns_of(records) is None


def test_a_key_with_a_lone_surrogate_crosses_a_shuffle(tmp_path):
    """Regression: a field name with a lone surrogate went into the columnar form's description,
    whose JSON encoding raised (a ShardError); such records now travel pickled, as the same
    surrogate in a value or a nested key already did."""
    from zephyr import Dataset, create_backend

    items = [{"\ud800": 1}, {"\ud800": 2}, {"x": "\udfff"}, {"a": {"\udfff": 1}}]
    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path))
    assert sorted(map(repr, backend.execute(Dataset.from_list(items).reshard(1)))) == sorted(map(repr, items))


def test_only_str_or_int_keys_are_columnar():
    assert key_column(["a", "b"]) is not None and key_column([1, 2**62]) is not None
    for keys in (["a", 1], [1.0, 2.0], [(1,), (2,)], [True, False], [2**64, 1], [None, None], ["\ud800", "x"]):
        assert key_column(keys) is None
    kb, _ = key_column(["x", "é"])
    assert kb.to_pylist() == [key_bytes("x"), key_bytes("é")]


# ---- columnar path vs pickled path through the public API ------------------------------------------


def _value(rng: random.Random, kind: str):
    if kind == "int":
        return rng.choice([rng.randint(-5, 5), rng.randint(-(2**62), 2**62)])
    if kind == "float":
        return rng.choice([rng.random(), -0.0, 1e300, float("inf"), float(rng.randint(0, 3))])
    if kind == "str":
        return rng.choice(["", "a", "Zürich", "日本語", "emoji 🎉", "x" * rng.randint(0, 3000)])
    if kind == "none":
        return None
    if kind == "nested":
        return {"k": [rng.randint(0, 3), {"deep": rng.choice([None, "v", 1.5])}]}
    if kind == "list":
        return [rng.randint(0, 9) for _ in range(rng.randint(0, 4))]
    if kind == "mixed":  # int or float or None in one field: must stay exactly what it was
        return rng.choice([1, 1.0, None, 2, 2.5, (1, 2), [1, 2]])
    return rng.choice([True, False])


def mixed_records(seed: int, n: int, keys: int):
    rng = random.Random(seed)
    kinds = ["int", "float", "str", "none", "nested", "list", "mixed", "bool"]
    fields = rng.sample(kinds, k=rng.randint(2, len(kinds)))
    out = []
    for i in range(n):
        record = {"key": f"k{rng.randint(0, keys)}", "i": i}
        for name in fields:
            record[name] = _value(rng, name)
        if rng.random() < 0.5:  # optional, so the field mixes None with values
            record["opt"] = rng.choice([None, rng.random()])
        else:
            record["opt"] = None
        out.append(record)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_columnar_and_pickled_paths_give_identical_outputs(seed, monkeypatch, tmp_path):
    records = mixed_records(seed, 3000, keys=200)
    shards = [records[i::3] for i in range(3)]
    ds = Dataset.from_list(shards).flat_map(list)
    pipelines = {
        "dedup": ds.deduplicate(lambda r: r["key"], num_output_shards=4),
        "group": ds.group_by(lambda r: r["key"], lambda k, items: (k, [r["i"] for r in items]), num_output_shards=3),
        "sorted": ds.group_by(lambda r: r["i"] % 17, lambda k, items: (k, [r["i"] for r in items]), sort_by=lambda r: -r["i"]),
        "combined": ds.map(lambda r: {"key": r["key"], "n": 1}).group_by(
            lambda r: r["key"], lambda k, items: (k, sum(r["n"] for r in items)),
            combiner=lambda k, items: {"key": k, "n": sum(r["n"] for r in items)}),
        "reshard": ds.reshard(5),
    }
    for name, pipeline in pipelines.items():
        columnar, execution = run(pipeline, monkeypatch, tmp_path / name, columnar=True)
        pickled, _ = run(pipeline, monkeypatch, tmp_path / name, columnar=False)
        assert [typed(x) for x in columnar] == [typed(x) for x in pickled], name
        if name in ("dedup", "group", "reshard"):
            assert execution.counters["zephyr/shuffle_runs_columnar"] == execution.counters["zephyr/shuffle_runs"] > 0
    dedup, _ = run(pipelines["dedup"], monkeypatch, tmp_path / "again", columnar=True)
    firsts = {}  # plain Python: the first record per key, by (input shard, position)
    for shard in shards:
        for r in shard:
            firsts.setdefault(r["key"], r)
    assert sorted(typed(r) for r in dedup) == sorted(typed(r) for r in firsts.values())


@pytest.mark.parametrize("json_payload", [True, False])
def test_records_that_do_not_convert_fall_back_and_keep_their_types(json_payload, monkeypatch, tmp_path):
    """int vs float across chunks, tuples vs lists, varying key sets, non-dicts: all exact."""
    ints = [{"k": f"k{i % 50}", "v": i} for i in range(3000)]
    floats = [{"k": f"k{i % 50}", "v": float(i)} for i in range(3000)]  # same field, now float
    ragged = [{"k": "r", "v": (1, "t")}, {"k": "r", "only": [1]}, ("not", "a dict")]
    ds = Dataset.from_list([ints + floats, ragged]).flat_map(list)
    out, execution = run(ds.reshard(2), monkeypatch, tmp_path, memory="64MiB", ZEPHYR_SHUFFLE_JSON=int(json_payload))
    assert sorted(map(typed, out)) == sorted(map(typed, ints + floats + ragged))
    # as JSON lines, ints then floats are one exact payload; as fields, the second chunk's
    # float column does not match the first's int column; the tuple never converts
    assert execution.counters["zephyr/shuffle_runs_columnar"] == (1 if json_payload else 0)
    values = [r["v"] for r in out if isinstance(r, dict) and r["k"] != "r"]
    assert sum(type(v) is int for v in values) == 3000 and sum(type(v) is float for v in values) == 3000


def test_group_keys_come_back_with_their_type(monkeypatch, tmp_path):
    rows = [{"n": i % 7, "s": str(i % 3)} for i in range(500)]
    ds = Dataset.from_list([rows[:250], rows[250:]]).flat_map(list)
    by_int, execution = run(ds.group_by(lambda r: r["n"], lambda k, items: (k, sum(1 for _ in items))), monkeypatch, tmp_path)
    assert execution.counters["zephyr/shuffle_runs_columnar"] > 0
    assert sorted(by_int) == [(k, sum(1 for r in rows if r["n"] == k)) for k in range(7)]
    assert all(type(k) is int for k, _ in by_int)
    by_str, _ = run(ds.group_by(lambda r: r["s"], lambda k, items: (k, sum(1 for _ in items))), monkeypatch, tmp_path / "s")
    assert sorted(by_str) == [("0", 167), ("1", 167), ("2", 166)]


# ---- skew -----------------------------------------------------------------------------------------


def skewed_records(n: int, partitions: int, hot_keys: int = 2000):
    """80% of the records in partition 0 (under many distinct keys), the rest spread out."""
    candidates = (f"hot{i}" for i in range(hot_keys * partitions * 3))
    hot = [k for k in candidates if partition_of(key_bytes(k), partitions) == 0][:hot_keys]
    rng = random.Random(7)
    out = []
    for i in range(n):
        key = rng.choice(hot) if rng.random() < 0.8 else f"cold{rng.randint(0, 5000)}"
        out.append({"key": key, "i": i, "pad": "p" * 150})
    return out


@pytest.mark.slow
@pytest.mark.parametrize("columnar", [True, False])
def test_skewed_partition_is_split_by_key_range_and_groups_stay_whole(columnar, monkeypatch, tmp_path):
    records = skewed_records(60_000, partitions=4)
    ds = Dataset.from_list([records[i::2] for i in range(2)]).flat_map(list)
    pipeline = ds.group_by(lambda r: r["key"], lambda k, items: (k, sorted(r["i"] for r in items)), num_output_shards=4)
    split, execution = run(pipeline, monkeypatch, tmp_path, columnar=columnar, memory="64MiB", ZEPHYR_SKEW_MIN_BYTES=0)
    unsplit, plain = run(pipeline, monkeypatch, tmp_path / "plain", columnar=columnar, memory="64MiB", ZEPHYR_SKEW_MAX_PIECES=1)
    reduce_stage = execution.stats[1]
    assert plain.stats[1].num_shards == 4
    assert reduce_stage.num_shards > 4  # partition 0 became several reduce tasks
    largest = reduce_stage.largest_partitions[0]
    assert largest.partition == 0 and largest.pieces > 1
    summary = format_summary(execution)  # what the CLI prints at the end of a run
    assert "largest partitions: partition 0: " in summary and f"in {largest.pieces} key ranges" in summary
    keys = [k for k, _ in split]
    assert len(keys) == len(set(keys))  # every group whole: each key reduced exactly once
    assert split == unsplit  # same groups, same order, across the output shards in order
    expected = {}
    for r in records:
        expected.setdefault(r["key"], []).append(r["i"])
    assert dict(split) == {k: sorted(v) for k, v in expected.items()}


@pytest.mark.slow
def test_skew_split_outputs_are_deterministic_files(monkeypatch, tmp_path):
    records = skewed_records(40_000, partitions=3, hot_keys=30_000)
    ds = Dataset.from_list([records[:20_000], records[20_000:]]).flat_map(list).deduplicate(lambda r: r["key"], num_output_shards=3)
    outputs = []
    for attempt in range(2):
        out_dir = tmp_path / f"out{attempt}"
        paths, execution = run(ds.write_jsonl(str(out_dir / "part-{shard:03d}-of-{total:03d}.jsonl")), monkeypatch,
                               tmp_path / f"r{attempt}", memory="64MiB", ZEPHYR_SKEW_MIN_BYTES=0)
        assert len(paths) == execution.stats[1].num_shards > 3
        outputs.append([(os.path.basename(p), open(p, "rb").read()) for p in paths])
    assert outputs[0] == outputs[1]
    kept = [line for _, data in outputs[0] for line in data.splitlines()]
    assert len(kept) == len({r["key"] for r in records})


# ---- resume from columnar runs ------------------------------------------------------------------------

RESUME_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, counters, create_backend

    def docs(i):
        counters.increment("map_calls")
        return [{"w": f"w{j % 7}", "shard": i, "x": j * 0.5} for j in range(500)]

    def reducer(key, items):
        if os.environ.get("DIE_IN_REDUCE"):
            os._exit(9)  # the driver dies between scatter and reduce
        return {"w": key, "n": sum(1 for _ in items)}

    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[2])
    ds = Dataset.from_list(list(range(6))).flat_map(docs).group_by(lambda r: r["w"], reducer, num_output_shards=2)
    execution = backend.execute(ds.write_jsonl(sys.argv[1] + "/part-{shard}.jsonl"))
    list(execution)
    c = execution.counters
    print("resumed", c["zephyr/map_shards_resumed"], "columnar", c["zephyr/shuffle_runs_columnar"], "calls", c["map_calls"])
    """
)


@pytest.mark.slow
def test_resume_between_scatter_and_reduce_with_columnar_runs(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(RESUME_SCRIPT)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    args = [sys.executable, str(script), str(out), str(scratch)]
    died = subprocess.run(args, env={**os.environ, "DIE_IN_REDUCE": "1"}, capture_output=True, text=True)
    assert died.returncode == 9
    assert list(scratch.rglob("*.arrow"))  # the map side left columnar runs behind
    rerun = subprocess.run(args, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed 6 columnar 6 calls 6" in rerun.stdout
    fresh = subprocess.run([sys.executable, str(script), str(tmp_path / "clean"), str(tmp_path / "s2")], capture_output=True, text=True)
    assert "resumed 0 columnar 6 calls 6" in fresh.stdout
    assert [p.read_bytes() for p in sorted((tmp_path / "clean").glob("part-*"))] == [p.read_bytes() for p in sorted(out.glob("part-*"))]
    assert len(list(out.glob("part-*"))) == 2


def test_progress_bar_names_the_largest_partition(capsys):
    backend = create_backend("sync", progress=True)
    ds = Dataset.from_list([[{"k": "a"}] * 50 + [{"k": "b"}]]).flat_map(list)
    assert sorted(backend.execute(ds.group_by(lambda r: r["k"], lambda k, items: (k, sum(1 for _ in items))))) == [("a", 50), ("b", 1)]
    err = capsys.readouterr().err
    assert "largest partition " in err  # on the reduce stage's bar: the biggest partition and its size


@settings(max_examples=150, deadline=None)
@given(runs=st.lists(st.lists(st.tuples(st.integers(0, 5), st.sampled_from([b"sa", b"sb", b"sc", b"s"])), max_size=25),
                     min_size=1, max_size=6),
       batch_rows=st.integers(1, 7))
def test_the_batch_merge_orders_rows_as_a_plain_sort(runs, batch_rows):
    """`merge.merge_sorted` over sorted sources cut into batches, with hashes that collide
    across different key bytes and across sources, against Python's `sorted` of all rows by
    (h, kb, shard, pos); `first_per_key` keeps the first row of each (h, kb)."""
    import numpy as np
    import pyarrow as pa
    from zephyr.shuffle.merge import merge_sorted

    schema = pa.schema([("h", pa.uint64()), ("kb", pa.large_binary()), ("s", pa.int32()), ("pos", pa.int64())])
    rows, sources = [], []
    for shard, run in enumerate(runs):
        ordered = sorted((h, kb, shard, pos) for pos, (h, kb) in enumerate(run))
        rows += ordered
        batches = [pa.RecordBatch.from_pylist([dict(zip(schema.names, r)) for r in ordered[i : i + batch_rows]], schema=schema)
                   for i in range(0, len(ordered), batch_rows)]
        sources.append(iter(batches))
    merged, firsts, previous = [], [], None
    for chunk in merge_sorted(sources, schema):
        table = pa.concat_tables(chunk.sorted_batches())
        chunk_rows = list(zip(*(table.column(c).to_pylist() for c in schema.names)))
        merged += chunk_rows
        starts = chunk.starts(previous)  # as first_per_key reads them, across chunk boundaries
        previous = chunk.last_key()
        firsts += [row for row, start in zip(chunk_rows, starts.tolist()) if start]
    assert merged == sorted(rows)
    assert np.all(np.diff([r[0] for r in merged]) >= 0)
    first_of = {}
    for row in sorted(rows):
        first_of.setdefault(row[:2], row)
    assert firsts == sorted(first_of.values())


@settings(max_examples=200, deadline=None)
@given(rows=st.lists(st.tuples(st.sampled_from([0, 1, 7, 65535, 65536, 2**32 - 1]), st.sampled_from([0, 3, 2**63, 2**64 - 1]),
                               st.sampled_from([b"sa", b"sb"])), max_size=40))
def test_a_spill_orders_rows_by_partition_hash_key_then_position(rows):
    """The map side's order (partition, h, kb, pos) against Python's sort of the same tuples (hash
    ties with equal or different key bytes, partitions past 16 bits)."""
    import numpy as np
    import pyarrow as pa

    from zephyr.shuffle.merge import sort_order

    table = pa.table({"p": pa.array([r[0] for r in rows], pa.uint32()), "h": pa.array([r[1] for r in rows], pa.uint64()),
                      "kb": pa.array([r[2] for r in rows], pa.large_binary()), "pos": pa.array(range(len(rows)), pa.int64())})
    expected = sorted(range(len(rows)), key=lambda i: (rows[i][0], rows[i][1], rows[i][2], i))
    assert sort_order(table, leading="p").tolist() == expected
    assert np.asarray(sort_order(table)).tolist() == sorted(range(len(rows)), key=lambda i: (rows[i][1], rows[i][2], i))
