"""The JSON-lines payload of the columnar shuffle: exact or refused, the same outputs as the
other paths, JSONL writes that copy the shuffled bytes, and the planner's trust in `load_jsonl`."""

import dataclasses
import datetime
import enum
import gzip
import itertools
import os
import pickle
import subprocess
import sys
import textwrap
import uuid
from collections import OrderedDict

import orjson
import pytest
import zstandard

from zephyr import Dataset, create_backend
from zephyr.shuffle.columnar import json_lines, records_of
from zephyr.io.json_records import JsonLines, line_bytes
from zephyr.plan.compile import compile_plan


def typed(value):
    """A comparable form that keeps types and float bits: 1 != 1.0, (1,) != [1]."""
    return pickle.dumps(value, protocol=5)


def run(ds, monkeypatch, scratch, **env):
    for name, value in env.items():
        monkeypatch.setenv(name, str(value))
    backend = create_backend("sync", progress=False, memory="16MiB", scratch_dir=str(scratch))
    execution = backend.execute(ds)
    return list(execution), execution


def decoded(records):
    lines = json_lines(records)
    return None if lines is None else records_of([lines], {"json": True})


# ---- exact, or refused -------------------------------------------------------------------------------

EXACT = [
    [{"a": 1}, {"a": 1.0}, {"a": -0.0}, {"a": 1e300}, {"a": 5e-324}, {"a": 2**63 - 1}, {"a": -(2**63)}, {"a": 2**64 - 1}],
    [{"a": None}, {"a": True}, {"a": False}, {"a": ""}, {"a": "é日本🎉\n\"\\"}, {"a": "x" * 200_000}],
    [{"b": 1, "a": 2}, {"a": 2, "b": 1}],  # key order kept, and records may differ in keys
    [{"n": {"deep": [1, [2.5, {"x": None}], {}], "e": []}}, {}],
    [[1, "two", None], "a bare string", 3, 4.5, None, True],  # JSON values need not be dicts
]


@pytest.mark.parametrize("records", EXACT, ids=range(len(EXACT)))
def test_json_values_round_trip_exactly(records):
    assert [typed(r) for r in decoded(records)] == [typed(r) for r in records]


class Colour(enum.Enum):
    RED = 1


class Text(str):
    pass


@dataclasses.dataclass
class Point:
    x: int


REFUSED = {
    "tuple": {"a": (1, 2)},
    "nested tuple": {"a": [1, {"b": (1,)}]},
    "nan": {"a": float("nan")},
    "nested inf": {"a": {"b": [float("inf")]}},
    "bytes": {"a": b"x"},
    "str subclass value": {"a": Text("x")},
    "str subclass key": {Text("a"): 1},
    "int key": {1: "x"},
    "dict subclass": OrderedDict(a=1),
    "nested dict subclass": {"a": OrderedDict(b=1)},
    "beyond 64 bits": {"a": 2**64},
    "lone surrogate": {"a": "\ud800"},
    "enum": {"a": Colour.RED},
    "uuid": {"a": uuid.UUID(int=1)},
    "datetime": {"a": datetime.datetime(2026, 1, 1)},
    "dataclass": {"a": Point(1)},
    "set": {"a": {1}},
}


@pytest.mark.parametrize("name", REFUSED)
def test_values_json_would_change_are_refused(name):
    assert json_lines([{"ok": 1}, REFUSED[name]]) is None


def test_cycles_are_refused_not_walked_forever():
    cycle: list = []
    cycle.append(cycle)
    assert json_lines([{"a": cycle}]) is None


# ---- the same outputs on every path ---------------------------------------------------------------------


def records(n: int):
    out = []
    for i in range(n):
        r = {"key": f"k{i % 97}", "i": i, "text": "é" * (i % 5) + str(i)}
        if i % 3 == 0:
            r["meta"] = {"tags": ["a", i % 4], "score": i / 7}
        if i % 11 == 0:
            r["odd"] = (i, "tuple")  # not JSON: these records take another path
        if i % 13 == 0:
            r["nan"] = float("nan")
        out.append(r)
    return out


@pytest.mark.slow
def test_json_fields_and_pickled_paths_give_identical_outputs(monkeypatch, tmp_path):
    data = records(4000)
    plain = [r for r in data if "odd" not in r and "nan" not in r]  # JSON-exact, so JSON lines
    for name, rows in (("mixed", data), ("json", plain)):
        ds = Dataset.from_list([rows[i::3] for i in range(3)]).flat_map(list)
        pipelines = {
            "dedup": ds.deduplicate(lambda r: r["key"], num_output_shards=4),
            "group": ds.group_by(lambda r: r["key"], lambda k, items: (k, [r["i"] for r in items]), num_output_shards=3),
            "sorted": ds.group_by(lambda r: r["i"] % 17, lambda k, items: (k, [r["i"] for r in items]), sort_by=lambda r: -r["i"]),
            "reshard": ds.reshard(5),
            "dedup then map": ds.deduplicate(lambda r: r["key"]).map(lambda r: (r["i"], r.get("meta"))),
        }
        for label, pipeline in pipelines.items():
            outputs = {}
            for path, env in (("json", {}), ("fields", {"ZEPHYR_SHUFFLE_JSON": 0}), ("pickled", {"ZEPHYR_SHUFFLE_COLUMNAR": 0})):
                monkeypatch.delenv("ZEPHYR_SHUFFLE_JSON", raising=False)
                monkeypatch.delenv("ZEPHYR_SHUFFLE_COLUMNAR", raising=False)
                out, execution = run(pipeline, monkeypatch, tmp_path / name / label / path, **env)
                outputs[path] = [typed(x) for x in out]
                if name == "json" and path == "json" and label != "sorted":
                    assert execution.counters["zephyr/shuffle_runs_columnar"] == execution.counters["zephyr/shuffle_runs"] > 0
            assert outputs["json"] == outputs["fields"] == outputs["pickled"], (name, label)


# ---- JSONL writes after a shuffle copy the shuffled bytes ----------------------------------------------


def write_corpus(directory, shards: int, per_shard: int) -> list[str]:
    directory.mkdir()
    paths = []
    for s in range(shards):
        path = directory / f"in-{s}.jsonl.zst"
        lines = b"".join(orjson.dumps({"id": f"{s}-{i}", "text": f"t{(s * per_shard + i) % (per_shard // 2)}", "n": i * 0.25}) + b"\n"
                         for i in range(per_shard))
        path.write_bytes(zstandard.ZstdCompressor().compress(lines))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("suffix", [".jsonl", ".jsonl.zst", ".jsonl.gz"])
def test_jsonl_written_from_json_lines_is_byte_identical_to_encoding_the_records(suffix, monkeypatch, tmp_path):
    paths = write_corpus(tmp_path / "in", shards=3, per_shard=3000)
    outputs, written, copied = {}, {}, []
    real_blocks = JsonLines.blocks
    monkeypatch.setattr(JsonLines, "blocks", lambda self: copied.append(1) or real_blocks(self))
    for path, env in (("json", {}), ("fields", {"ZEPHYR_SHUFFLE_JSON": 0}), ("pickled", {"ZEPHYR_SHUFFLE_COLUMNAR": 0})):
        for shuffle in ("dedup", "reshard"):
            ds = Dataset.from_files(paths).load_jsonl()
            ds = ds.deduplicate(lambda r: r["text"]) if shuffle == "dedup" else ds.reshard(2)
            out_dir = tmp_path / path / shuffle
            files, execution = run(ds.write_jsonl(str(out_dir / ("part-{shard}" + suffix))), monkeypatch, tmp_path / f"s-{path}-{shuffle}", **env)
            outputs[path, shuffle] = [open(f, "rb").read() for f in sorted(files)]
            assert bool(copied) == (path == "json"), (path, shuffle)  # the bytes were copied on the JSON path only
            copied.clear()
            written[path, shuffle] = execution.counters["zephyr/records_written"]
            monkeypatch.delenv("ZEPHYR_SHUFFLE_JSON", raising=False)
            monkeypatch.delenv("ZEPHYR_SHUFFLE_COLUMNAR", raising=False)
    for shuffle in ("dedup", "reshard"):
        assert outputs["json", shuffle] == outputs["fields", shuffle] == outputs["pickled", shuffle]
        assert written["json", shuffle] == written["fields", shuffle] == written["pickled", shuffle]
    assert written["json", "reshard"] == 9000 and written["json", "dedup"] == 1500
    opener = gzip.open if suffix.endswith(".gz") else (lambda p: zstandard.open(p, "rb")) if suffix.endswith(".zst") else open
    first = sorted((tmp_path / "json" / "dedup").glob("part-*"))[0]
    with opener(first) as f:
        assert all(set(orjson.loads(line)) == {"id", "text", "n"} for line in f.read().splitlines())


def test_the_write_copies_bytes_without_decoding(monkeypatch, tmp_path):
    """A dedup from load_jsonl straight into write_jsonl never decodes a shuffled record."""
    paths = write_corpus(tmp_path / "in", shards=2, per_shard=2000)
    calls = []
    real = JsonLines.__iter__
    monkeypatch.setattr(JsonLines, "__iter__", lambda self: calls.append(1) or real(self))
    ds = Dataset.from_files(paths).load_jsonl().deduplicate(lambda r: r["text"]).write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl"))
    files, execution = run(ds, monkeypatch, tmp_path / "s")
    assert calls == []
    assert sum(len(open(f, "rb").read().splitlines()) for f in files) == 1000 == execution.counters["zephyr/records_written"]
    assert execution.status.snapshot()["stages"][1]["items_in"] == 1000  # the reduce stage still counts its records in
    mapped = Dataset.from_files(paths).load_jsonl().deduplicate(lambda r: r["text"]).map(lambda r: r["id"])
    ids, mapped_run = run(mapped, monkeypatch, tmp_path / "s2")
    assert len(ids) == len(set(ids)) == 1000 and calls  # other ops decode the records
    assert mapped_run.status.snapshot()["stages"][1]["items_in"] == 1000  # and count them in


def test_other_consumers_get_a_plain_iterator_of_records(monkeypatch, tmp_path):
    """Only a JSONL writer sees the `JsonLines`; a reducer or a map_shard function gets what
    any stream gives: an iterator, for which `iter(it) is it`."""
    import statistics

    ds = Dataset.from_list([[1, 2], [3, 4]]).flat_map(lambda x: x)
    hm, _ = run(ds.reduce(statistics.harmonic_mean), monkeypatch, tmp_path / "hm")  # reshard(1), then the reducer
    assert hm == [pytest.approx(statistics.harmonic_mean([1, 2, 3, 4]))]
    kinds, _ = run(ds.reshard(2).map_shard(lambda it: [iter(it) is it, sum(it)]), monkeypatch, tmp_path / "ms")
    assert kinds[0::2] == [True, True] and sum(kinds[1::2]) == 10


def test_a_buffer_that_holds_fields_stays_fields(monkeypatch, tmp_path):
    """A NaN in the first chunk makes that chunk fields; later chunks that are JSON data join
    it as fields too, so the run stays columnar instead of turning into pickles."""
    rows = [{"k": f"k{i % 100}", "x": float("nan") if i == 0 else i * 0.5} for i in range(20_000)]
    out, execution = run(Dataset.from_list([rows]).flat_map(list).deduplicate(lambda r: r["k"]), monkeypatch, tmp_path / "s")
    assert len(out) == 100
    assert execution.counters["zephyr/shuffle_runs_columnar"] == execution.counters["zephyr/shuffle_runs"] > 0


def test_json_lines_stream_iterates_once_and_counts_either_way():
    import pyarrow as pa

    arrays = [pa.array([orjson.dumps({"i": i}) + b"\n" for i in range(j, j + 3)], pa.large_binary()) for j in (0, 3, 6)]
    stream = JsonLines(iter(arrays))
    assert list(itertools.islice(stream, 2)) == [{"i": 0}, {"i": 1}]
    assert list(itertools.islice(stream, 2)) == [{"i": 2}, {"i": 3}]  # iter() continues, it does not restart
    with pytest.raises(RuntimeError, match="after iterating"):
        next(stream.blocks())
    assert next(stream.copied()) == 0  # iterated records are counted by the runner, like any stream's
    copied = JsonLines(iter([a.slice(1) for a in arrays]))  # sliced arrays: only their rows' bytes
    blocks = list(copied.blocks())
    assert [len(b) for b in blocks] == [2, 2, 2]
    assert b"".join(bytes(line_bytes(b)) for b in blocks).splitlines() == [orjson.dumps({"i": i}) for i in (1, 2, 4, 5, 7, 8)]
    assert next(copied.copied()) == 6


# ---- what the planner trusts ------------------------------------------------------------------------------


def test_only_a_stage_that_just_loads_json_lines_skips_the_exactness_check(tmp_path):
    (tmp_path / "a.jsonl").write_text('{"k": 1}\n')
    paths = [str(tmp_path / "a.jsonl")]
    key = lambda r: r["k"]  # noqa: E731
    loaded = Dataset.from_files(paths).load_jsonl()
    trusted = compile_plan(loaded.deduplicate(key).group_by(key, lambda k, items: k))
    assert [s.sink.parsed_json for s in trusted.stages[:2]] == [True, False]  # the second scatter's items are reducer outputs
    assert not compile_plan(loaded.map(lambda r: r).deduplicate(key)).stages[0].sink.parsed_json
    assert not compile_plan(Dataset.from_list([{"k": 1}]).deduplicate(key)).stages[0].sink.parsed_json
    assert not compile_plan(Dataset.from_files(paths).load_file().deduplicate(key)).stages[0].sink.parsed_json
    # a file path column is the caller's string (maybe a str subclass): not the parser's
    assert not compile_plan(Dataset.from_files(paths).load_jsonl(include_file_paths=True).deduplicate(key)).stages[0].sink.parsed_json


def test_a_file_path_given_as_a_str_subclass_keeps_its_type(monkeypatch, tmp_path):
    (tmp_path / "a.jsonl").write_text('{"k": 1}\n{"k": 2}\n')
    path = Text(str(tmp_path / "a.jsonl"))
    ds = Dataset.from_files([path]).load_jsonl(include_file_paths=True).deduplicate(lambda r: r["k"])
    out, _ = run(ds, monkeypatch, tmp_path / "s")
    assert sorted(type(r["__file_path"]).__name__ for r in out) == ["Text", "Text"]


# ---- resume between scatter and reduce with JSON-lines runs ---------------------------------------------

RESUME_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, create_backend
    from zephyr.io import jsonl

    real = jsonl.write_jsonl_file
    def dying(items, path, **kw):
        if os.environ.get("DIE_IN_REDUCE"):
            os._exit(9)  # the driver dies between scatter and reduce
        return real(items, path, **kw)
    jsonl.write_jsonl_file = dying
    import zephyr.execution.shard
    zephyr.execution.shard.write_jsonl_file = dying

    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[2])
    paths = sorted(os.path.join(sys.argv[3], p) for p in os.listdir(sys.argv[3]))
    ds = Dataset.from_files(paths).load_jsonl().deduplicate(lambda r: r["text"], num_output_shards=2)
    execution = backend.execute(ds.write_jsonl(sys.argv[1] + "/part-{shard}.jsonl.zst"))
    list(execution)
    c = execution.counters
    print("resumed", c["zephyr/map_shards_resumed"], "columnar", c["zephyr/shuffle_runs_columnar"])
    """
)


@pytest.mark.slow
def test_resume_between_scatter_and_reduce_with_json_runs(tmp_path):
    write_corpus(tmp_path / "in", shards=3, per_shard=1000)
    script = tmp_path / "job.py"
    script.write_text(RESUME_SCRIPT)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    args = [sys.executable, str(script), str(out), str(scratch), str(tmp_path / "in")]
    died = subprocess.run(args, env={**os.environ, "DIE_IN_REDUCE": "1"}, capture_output=True, text=True, timeout=300)
    assert died.returncode == 9, died.stderr
    assert list(scratch.rglob("*.arrow"))  # the map side left JSON-lines runs behind
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    assert "resumed 3 columnar 3" in rerun.stdout
    clean = tmp_path / "clean"
    fresh = subprocess.run([sys.executable, str(script), str(clean), str(tmp_path / "s2"), str(tmp_path / "in")], capture_output=True, text=True,
                           timeout=300)
    assert "resumed 0 columnar 3" in fresh.stdout, fresh.stderr
    assert [p.read_bytes() for p in sorted(clean.glob("part-*"))] == [p.read_bytes() for p in sorted(out.glob("part-*"))]
    assert len(list(out.glob("part-*"))) == 2
