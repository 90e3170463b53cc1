"""The Zephyr API of the reference project, on every backend: select, window_by, map_shard
with ShardInfo, sorted_merge_join's combiner, reshard's check, {basename} and callable
output patterns, write_binary."""

import gzip
import os

import pytest

from zephyr import Dataset, PlanError, ShardError, ShardInfo, counters


def run(backend, ds):
    return list(backend.execute(ds))


RECORDS = [{"id": i, "text": f"doc {i}", "lang": "en" if i % 3 else "fr"} for i in range(9)]


def test_select_keeps_named_keys_in_the_given_order_and_drops_missing_ones(backend):
    ds = Dataset.from_list([RECORDS[:4], RECORDS[4:]]).flat_map(list).select("text", "id", "missing")
    got = run(backend, ds)
    assert got == [{"text": r["text"], "id": r["id"]} for r in RECORDS]
    assert all(list(r) == ["text", "id"] for r in got)


def test_select_checks_its_arguments_and_items():
    with pytest.raises(ValueError, match="at least one column"):
        Dataset.from_list([1]).select()
    with pytest.raises(TypeError, match="column names as strings"):
        Dataset.from_list([1]).select("a", 2)


def test_select_on_non_dict_items_names_the_shard(local_backend):
    with pytest.raises(ShardError, match="select\\(\\) needs dict records, got int"):
        run(local_backend, Dataset.from_list([1]).select("a"))


def by_size(total, text):
    """Stay while the window holds at most 10 characters."""
    return total + len(text) <= 10, total + len(text)


def test_window_by_closes_windows_by_a_fold(backend):
    texts = ["aaaa", "bbb", "cc", "ddddddddddddd", "e", "ffffff", "ggg", "h"]
    ds = Dataset.from_list([texts[:5], texts[5:]]).flat_map(list).window_by(by_size, 0)
    # per shard; "e" opens a new window because the oversized item's window already holds 13
    assert run(backend, ds) == [["aaaa", "bbb", "cc"], ["ddddddddddddd"], ["e"], ["ffffff", "ggg", "h"]]


def test_window_by_with_a_counting_fold_is_window(backend):
    count = Dataset.from_iterable(range(7)).window_by(lambda n, _: (n < 3, n + 1), 0)
    assert run(backend, count) == run(backend, Dataset.from_iterable(range(7)).window(3)) == [[0, 1, 2], [3, 4, 5], [6]]
    assert run(backend, Dataset.from_iterable(range(3)).window_by(lambda state, item: (False, state))) == [[0], [1], [2]]


def tag_with_shard(items, info: ShardInfo):
    for item in items:
        yield (info.shard_idx, info.total_shards, item)


def test_map_shard_with_two_parameters_receives_shard_info(backend):
    ds = Dataset.from_list([[10, 11], [12], [13]]).flat_map(list).map_shard(tag_with_shard)
    assert run(backend, ds) == [(0, 3, 10), (0, 3, 11), (1, 3, 12), (2, 3, 13)]
    one = Dataset.from_list([[1, 2], [3]]).flat_map(list).map_shard(lambda items: [sum(items)])
    assert run(backend, one) == [3, 3]
    with_default = Dataset.from_list([[1, 2]]).flat_map(list).map_shard(lambda items, scale=10: [x * scale for x in items])
    assert run(backend, with_default) == [10, 20]  # an optional second parameter is not ShardInfo


def test_sorted_merge_join_default_combiner_merges_dicts(backend):
    left = Dataset.from_list([[{"id": 1, "a": "x"}, {"id": 2, "a": "y"}, {"id": 4, "a": "z"}]]).flat_map(list)
    right = Dataset.from_list([[{"id": 1, "b": 10}, {"id": 2, "a": "right wins", "b": 20}, {"id": 3, "b": 30}]]).flat_map(list)
    key = lambda r: r["id"]  # noqa: E731
    assert run(backend, left.sorted_merge_join(right, key, key)) == [
        {"id": 1, "a": "x", "b": 10},
        {"id": 2, "a": "right wins", "b": 20},
    ]
    assert run(backend, left.sorted_merge_join(right, key, key, how="left"))[-1] == {"id": 4, "a": "z"}  # left alone
    seen = run(backend, left.sorted_merge_join(right, key, key, combiner=lambda lt, rt: (lt["id"], rt and rt["b"]), how="left"))
    assert seen == [(1, 10), (2, 20), (4, None)]


def test_sorted_merge_join_argument_errors(local_backend):
    ds = Dataset.from_list([1])
    with pytest.raises(TypeError, match="combiner must be callable.*pass how= by name"):
        ds.sorted_merge_join(ds, int, int, "left")
    with pytest.raises(ShardError, match="default combiner merges dicts, got int and int"):
        run(local_backend, ds.sorted_merge_join(ds, int, int))


@pytest.mark.parametrize("n", [0, -3])
def test_reshard_to_zero_or_fewer_shards_is_a_value_error(n):
    with pytest.raises(ValueError, match=f"num_shards must be positive, got {n}"):
        Dataset.from_list([1, 2]).reshard(n)


def write_inputs(directory, names):
    directory.mkdir(parents=True, exist_ok=True)
    for i, name in enumerate(names):
        with gzip.open(directory / name, "wt") as f:
            f.write(f'{{"i": {i}}}\n')
    return str(directory / "*.jsonl.gz")


def test_basename_names_each_output_after_its_input_file(backend, tmp_path):
    pattern = write_inputs(tmp_path / "raw", ["CC-a.jsonl.gz", "CC-b.jsonl.gz", "CC-c.jsonl.gz"])
    out = tmp_path / "clean"
    ds = Dataset.from_files(pattern).load_jsonl().map(lambda r: {**r, "ok": True}).write_jsonl(str(out / "{basename}.jsonl.zst"))
    assert run(backend, ds) == [str(out / f"CC-{x}.jsonl.zst") for x in "abc"]
    back = run(backend, Dataset.from_files(str(out / "*.jsonl.zst")).load_jsonl())
    assert back == [{"i": i, "ok": True} for i in range(3)]


def test_basename_needs_one_distinct_input_file_per_shard(tmp_path):
    write_inputs(tmp_path / "x", ["same.jsonl.gz"])
    write_inputs(tmp_path / "y", ["same.jsonl.gz"])
    twice = Dataset.from_files([str(tmp_path / "x" / "*.gz"), str(tmp_path / "y" / "*.gz")]).load_jsonl()
    with pytest.raises(PlanError, match="gives shards 0 and 1 the same path .*add \\{shard\\}"):
        twice.write_jsonl(str(tmp_path / "o" / "{basename}.jsonl")).plan()
    assert twice.write_jsonl(str(tmp_path / "o" / "{basename}-{shard}.jsonl")).plan().num_shards == 2
    shuffled = twice.reshard(2).write_jsonl(str(tmp_path / "o" / "{basename}.jsonl"))
    with pytest.raises(PlanError, match="needs one input file per shard .*the output of a shuffle"):
        shuffled.plan()
    with pytest.raises(ValueError, match="unknown field\\(s\\) \\['name'\\]"):
        twice.write_jsonl(str(tmp_path / "{name}.jsonl"))


def test_callable_output_pattern_and_skip_existing(backend, tmp_path):
    def where(shard, total):
        return str(tmp_path / f"part-{shard}-of-{total}.jsonl")

    def counted(x):
        counters.increment("calls")
        return {"x": x}

    ds = Dataset.from_list([1, 2, 3]).map(counted).write_jsonl(where, skip_existing=True)
    assert "write_jsonl(test_callable_output_pattern_and_skip_existing.<locals>.where" in ds.describe()
    first = backend.execute(ds)
    assert list(first) == [where(i, 3) for i in range(3)] and first.counters["calls"] == 3
    os.remove(where(1, 3))
    again = backend.execute(ds)
    assert list(again) == [where(i, 3) for i in range(3)] and again.counters["calls"] == 1


def test_callable_output_pattern_must_return_a_path(local_backend):
    with pytest.raises(ValueError, match="must return a non-empty path string, got None for shard 0 of 1"):
        run(local_backend, Dataset.from_list([1]).write_jsonl(lambda shard, total: None))


def test_write_binary_writes_bytes_back_to_back(backend, tmp_path):
    chunks = [[b"GIF", b"\x00\x01"], [bytearray(b"raw"), b""]]
    ds = Dataset.from_list(chunks).flat_map(list).write_binary(str(tmp_path / "blob-{shard}.bin"))
    paths = run(backend, ds)
    assert [open(p, "rb").read() for p in paths] == [b"GIF\x00\x01", b"raw"]
    zipped = run(backend, Dataset.from_list([b"abc" * 100]).write_binary(str(tmp_path / "z-{shard}.bin.gz")))
    assert gzip.open(zipped[0]).read() == b"abc" * 100


def test_write_binary_rejects_non_bytes_naming_record_and_path(local_backend, tmp_path):
    target = tmp_path / "b-{shard}.bin"
    with pytest.raises(ShardError, match="b-0.bin: write_binary needs bytes items; record 1 is str"):
        run(local_backend, Dataset.from_list([[b"ok", "text"]]).flat_map(list).write_binary(str(target)))
    assert not (tmp_path / "b-0.bin").exists()  # nothing half-written


def test_callable_output_pattern_giving_shards_one_path_is_refused_before_running(local_backend, tmp_path):
    """Review bug 3: `write_jsonl(lambda s, t: "same.jsonl")` over 3 shards ran, and each shard
    overwrote the last: only one shard's data was left, silently."""
    same = str(tmp_path / "same.jsonl")
    ran = tmp_path / "ran"

    def mark(x):
        ran.write_text("")
        return x

    ds = Dataset.from_list([1, 2, 3]).map(mark).write_jsonl(lambda shard, total: same)
    with pytest.raises(PlanError, match="output path function .* gives shards 0 and 1 the same path .*same.jsonl"):
        run(local_backend, ds)
    assert not ran.exists() and not os.path.exists(same)
    assert isinstance(PlanError("x"), ValueError)


def test_basename_needs_files_from_from_files(tmp_path):
    """Review bug 3: `{basename}` took any string item of from_list for a file name."""
    pattern = write_inputs(tmp_path / "raw", ["a.jsonl.gz", "b.jsonl.gz"])
    files = sorted(str(p) for p in (tmp_path / "raw").iterdir())
    out = str(tmp_path / "o" / "{basename}.jsonl")
    for listed in (Dataset.from_list(["doc one", "doc two"]), Dataset.from_list(files).load_jsonl()):
        with pytest.raises(PlanError, match="uses \\{basename\\}, which needs one input file per shard .*items of from_list"):
            listed.write_jsonl(out).plan()
    assert Dataset.from_files(pattern).load_jsonl().write_jsonl(out).plan().num_shards == 2
