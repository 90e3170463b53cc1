"""group_by, deduplicate, reshard, reduce/count and sorted_merge_join against plain Python."""

import collections
import dataclasses
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zephyr import Dataset, PlanError, ShardError, StaleOutputsError, counters, create_backend
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output


def word_shards():
    words = ["a", "b", "c", "a", "b", "a", None, "d", "the"] * 7 + ["the"] * 40  # skewed toward "the"
    return [words[i : i + 13] for i in range(0, len(words), 13)]


def words_dataset():
    return Dataset.from_list(word_shards()).flat_map(list)


def all_words():
    return [w for shard in word_shards() for w in shard]


def count_group(key, items):
    return (key, sum(1 for _ in items))


def test_group_by_counts_match_collections_counter(backend):
    got = dict(backend.execute(words_dataset().group_by(lambda w: w, count_group)))
    assert got == dict(collections.Counter(all_words()))


@pytest.mark.parametrize("num_output_shards", [1, 3, 16])
def test_group_by_output_shards(local_backend, num_output_shards):
    ds = words_dataset().group_by(lambda w: w, count_group, num_output_shards=num_output_shards)
    assert ds.plan().num_shards == num_output_shards
    assert dict(local_backend.execute(ds)) == dict(collections.Counter(all_words()))


def test_default_output_shards_is_the_input_shard_count():
    assert words_dataset().group_by(str, count_group).plan().num_shards == len(word_shards())


def test_empty_input(backend, tmp_path):
    empty = Dataset.from_files(str(tmp_path / "*.jsonl"), empty_glob_ok=True).load_jsonl()
    assert list(backend.execute(empty.group_by(lambda r: r["k"], count_group))) == []
    assert list(backend.execute(Dataset.from_list([[]]).flat_map(list).group_by(str, count_group))) == []
    # as in the reference project: no value for an empty dataset, and empty shards add none
    assert list(backend.execute(Dataset.from_list([[]]).flat_map(list).count())) == []
    assert list(backend.execute(empty.count())) == list(backend.execute(empty.reduce(max))) == []
    assert list(backend.execute(Dataset.from_list([[], [3, 1], []]).flat_map(list).reduce(max))) == [3]


def test_a_single_huge_group_streams_to_the_reducer(local_backend):
    def longest_run(key, items):
        n = 0
        for _ in items:  # consumed as a stream; never materialized by zephyr
            n += 1
        return key, n

    ds = Dataset.from_list([0, 1, 2, 3]).flat_map(lambda i: ({"k": "same", "i": j} for j in range(25_000)))
    assert list(local_backend.execute(ds.group_by(lambda r: r["k"], longest_run))) == [("same", 100_000)]


def test_sort_by_orders_items_within_each_group(backend):
    ds = Dataset.from_list([[5, 3, 9], [1, 8, 2], [7, 4, 6]]).flat_map(list)
    grouped = backend.execute(ds.group_by(lambda x: x % 2, lambda k, items: (k, list(items)), sort_by=lambda x: -x))
    assert dict(grouped) == {0: [8, 6, 4, 2], 1: [9, 7, 5, 3, 1]}


def test_generator_reducer_yields_several_items(local_backend):
    def explode(key, items):
        for item in items:
            yield f"{key}:{item}"

    got = list(local_backend.execute(Dataset.from_list([[1, 2, 3, 4]]).flat_map(list).group_by(lambda x: x % 2, explode)))
    assert sorted(got) == ["0:2", "0:4", "1:1", "1:3"]


def test_combiner_pre_aggregates_on_the_map_side(backend):
    ds = words_dataset().map(lambda w: (w, 1))
    execution = backend.execute(
        ds.group_by(lambda kv: kv[0], lambda k, items: (k, sum(v for _, v in items)), combiner=lambda k, items: (k, sum(v for _, v in items)))
    )
    assert dict(execution) == dict(collections.Counter(all_words()))
    # one combined record per (map shard, key) crosses the shuffle, not one per word
    distinct_per_shard = sum(len(set(shard)) for shard in word_shards())
    assert execution.counters["zephyr/shuffle_records"] == len(all_words())
    assert execution.counters["zephyr/combined_records"] == distinct_per_shard < len(all_words())


def test_deduplicate_keeps_the_first_by_shard_and_position(backend):
    rows = [[("x", "s0p0"), ("y", "s0p1"), ("x", "s0p2")], [("y", "s1p0"), ("z", "s1p1")], [("z", "s2p0"), ("x", "s2p1")]]
    got = backend.execute(Dataset.from_list(rows).flat_map(list).deduplicate(lambda r: r[0], num_output_shards=2))
    assert sorted(got) == [("x", "s0p0"), ("y", "s0p1"), ("z", "s1p1")]


def test_reshard_redistributes_and_keeps_every_item(backend):
    ds = Dataset.from_list([list(range(0, 10)), list(range(10, 13)), list(range(13, 40))]).flat_map(list).reshard(4)
    assert ds.plan().num_shards == 4
    per_shard = list(backend.execute(ds.map_shard(lambda it: [list(it)])))
    assert len(per_shard) == 4
    assert sorted(x for shard in per_shard for x in shard) == list(range(40))
    assert max(map(len, per_shard)) - min(map(len, per_shard)) <= 3  # balanced
    for shard in per_shard:
        assert shard == sorted(shard)  # input order kept within a shard


def test_reshard_docstring_example_shards_round_robin(backend):
    """Dataset.reshard's docstring: within a shard input order, across shards round-robin
    (it used to say "keeping their order", which the shards one after another are not)."""
    ds = Dataset.from_iterable([0, 1, 2, 3]).reshard(2)
    assert list(backend.execute(ds.map_shard(lambda it: [list(it)]))) == [[0, 2], [1, 3]]


def test_reshard_of_many_small_shards_fills_as_many_outputs_as_it_can(backend):
    """Regression: each input shard's round-robin started at its own index, so 10 input shards of
    3 items went to outputs 0..11 of 50. The oracle: 30 items can fill 30 outputs."""
    ds = Dataset.from_list([[10 * s + i for i in range(3)] for s in range(10)]).flat_map(list).reshard(50)
    per_shard = list(backend.execute(ds.map_shard(lambda it: [list(it)])))
    assert sorted(x for shard in per_shard for x in shard) == sorted(10 * s + i for s in range(10) for i in range(3))
    assert sum(1 for shard in per_shard if shard) == 30
    assert all(shard == sorted(shard) for shard in per_shard)


def test_reshard_arguments():
    ds = Dataset.from_list([1])
    assert ds.reshard(None) is ds
    for bad in (0, -5, 2.5):
        with pytest.raises(ValueError, match="num_shards must be (positive|a positive integer or None)"):
            ds.reshard(bad)


def test_reduce_and_count(backend):
    ds = Dataset.from_list([list(range(10)), list(range(10, 25))]).flat_map(list)
    assert list(backend.execute(ds.count())) == [25]
    assert list(backend.execute(ds.reduce(sum))) == [sum(range(25))]
    assert list(backend.execute(ds.reduce(lambda it: max(it), max))) == [24]


@dataclasses.dataclass(frozen=True)
class Doc:
    url: str
    domain: tuple
    body: str


def test_any_picklable_item_and_key(backend):
    docs = [Doc(f"u{i}", ("example.org", i % 3), "x" * i) for i in range(30)]
    ds = Dataset.from_list([docs[:10], docs[10:]]).flat_map(list)
    got = dict(backend.execute(ds.group_by(lambda d: d.domain, lambda k, items: (k, sorted(d.url for d in items)))))
    expected = collections.defaultdict(list)
    for d in docs:
        expected[d.domain].append(d.url)
    assert got == {k: sorted(v) for k, v in expected.items()}
    assert len(list(backend.execute(ds.deduplicate(lambda d: {"domain": list(d.domain)})))) == 3


Name = collections.namedtuple("Name", "first last")


def name_record(i):
    """Equal keys, built differently: one str object in both fields, or two equal ones."""
    shared = "".join(["An", "na"])
    return {"i": i, "name": Name(shared, shared) if i % 2 == 0 else Name(shared, "".join(["A", "nna"]))}


def test_equal_keys_holding_shared_or_separate_objects_are_one_key(backend):
    """Regression: keys of other types (a namedtuple) were pickled with the memo, which writes
    a second reference to one object as a back-reference, so Name(s, s) and Name(s, copy of s)
    got different key bytes: group_by split the group and deduplicate kept both."""
    ds = Dataset.from_list(list(range(4))).map(name_record)
    groups = list(backend.execute(ds.group_by(lambda r: r["name"], lambda k, items: (k, sorted(r["i"] for r in items)))))
    assert groups == [(Name("Anna", "Anna"), [0, 1, 2, 3])]
    assert [r["i"] for r in backend.execute(ds.deduplicate(lambda r: r["name"]))] == [0]


def test_join_inner_and_left(backend):
    left = Dataset.from_list([[1, 2, 2, 5], [7, 9]]).flat_map(list)
    right = Dataset.from_list([[(2, "b"), (2, "b2"), (3, "c"), (5, "e")], [(9, "i")]]).flat_map(list)
    pair = lambda left_item, right_item: (left_item, right_item)  # noqa: E731
    inner = list(backend.execute(left.sorted_merge_join(right, lambda x: x, lambda r: r[0], combiner=pair)))
    assert inner == [(2, (2, "b")), (2, (2, "b2")), (2, (2, "b")), (2, (2, "b2")), (5, (5, "e")), (9, (9, "i"))]
    left_join = list(backend.execute(left.sorted_merge_join(right, lambda x: x, lambda r: r[0], combiner=pair, how="left")))
    assert left_join[0] == (1, None) and (7, None) in left_join and len(left_join) == 8


def test_join_checks_shard_counts_and_sortedness(local_backend):
    left = Dataset.from_list([1, 2, 3])
    with pytest.raises(PlanError, match="left has 3 shards, right has 2"):
        left.sorted_merge_join(Dataset.from_list([1, 2]), int, int).plan()
    unsorted = Dataset.from_list([[3, 1]]).flat_map(list)
    with pytest.raises(ShardError, match="left input of shard 0 is not sorted by its key: 1 comes after 3"):
        list(local_backend.execute(unsorted.sorted_merge_join(Dataset.from_list([[1]]).flat_map(list), int, int)))
    with pytest.raises(PlanError, match="must be a single-stage pipeline"):
        left.sorted_merge_join(Dataset.from_list([1, 2, 3]).reshard(3), int, int).plan()


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_right_side_that_goes_backwards_after_the_left_ends_fails_the_shard(local_backend, how):
    """Regression: right [2, 1] against left [1]: the merge stopped when the left side ended and
    never read the 1, so the match was lost with no error (the inner join gave nothing)."""
    left = Dataset.from_list([[1]]).flat_map(list)
    right = Dataset.from_list([[2, 1]]).flat_map(list)
    with pytest.raises(ShardError, match="right input of shard 0 is not sorted by its key: 1 comes after 2"):
        list(local_backend.execute(left.sorted_merge_join(right, int, int, combiner=lambda a, b: (a, b), how=how)))


def pair_of(left_item, right_item):
    return (left_item, right_item)


@pytest.mark.parametrize("how", ["inner", "left"])
def test_a_nan_join_key_matches_nothing_and_no_other_key_misses_for_it(local_backend, how):
    """Regression: NaN compares false with everything, so a right NaN never moved past a left
    key (right [nan, 5] lost the 5 of left [5]), a NaN inside a run of equal keys split it
    (right [0, nan, 0]: the second 0 was lost; left [0, nan, 0]: the second 0 found no right
    rows), and a NaN between two keys hid one going backwards (left [5, nan, 3] passed as
    sorted and its 3 lost its match). NaN matches nothing; every other key joins as in a
    nested-loop join by ==, or a key going backwards fails the shard."""
    nan = float("nan")
    join = lambda lefts, rights: list(local_backend.execute(  # noqa: E731
        Dataset.from_list([lefts]).flat_map(list).sorted_merge_join(
            Dataset.from_list([rights]).flat_map(list), lambda x: x[0], lambda x: x[0], combiner=pair_of, how=how)))
    missed = lambda *lefts: [(x, None) for x in lefts] if how == "left" else []  # noqa: E731
    assert join([(5, "a")], [(nan, "x"), (5, "y")]) == [((5, "a"), (5, "y"))]
    assert join([(0, "a")], [(0, "x"), (nan, "y"), (0, "z")]) == [((0, "a"), (0, "x")), ((0, "a"), (0, "z"))]
    assert join([(0, "a"), (nan, "b"), (0, "c")], [(0, "x")]) == [((0, "a"), (0, "x"))] + missed((nan, "b")) + [((0, "c"), (0, "x"))]
    assert join([(nan, "a"), (1, "b")], [(nan, "x"), (1, "y")]) == missed((nan, "a")) + [((1, "b"), (1, "y"))]
    with pytest.raises(ShardError, match="left input of shard 0 is not sorted by its key: 3 comes after 5"):
        join([(5, "a"), (nan, "b"), (3, "c")], [(3, "x"), (5, "y")])
    with pytest.raises(ShardError, match="right input of shard 0 is not sorted by its key: 3 comes after 5"):
        join([(3, "a"), (5, "b")], [(5, "y"), (nan, "x"), (3, "z")])


def test_join_keys_that_cannot_be_ordered_name_the_join(local_backend):
    """None keys (or str against int) raised a bare TypeError from `<`."""
    left = Dataset.from_list([[{"k": None}, {"k": None}]]).flat_map(list)
    right = Dataset.from_list([[{"k": None}, {"k": 1}]]).flat_map(list)
    with pytest.raises(ShardError, match=r"sorted_merge_join: shard 0's join keys .* cannot be ordered"):
        list(local_backend.execute(left.sorted_merge_join(right, lambda r: r["k"], lambda r: r["k"])))


def by_k(r):
    return r["k"]


def test_a_skewed_group_by_joined_shard_by_shard_is_not_cut_into_key_ranges(local_backend, monkeypatch):
    """Regression: a skewed partition was cut into key ranges, which added reduce shards and
    moved every later partition to a higher shard, so an inline sorted_merge_join paired them
    with the wrong right shards and failed with an IndexError past the right's last shard."""
    from zephyr.shuffle.keys import key_bytes, partition_of

    monkeypatch.setenv("ZEPHYR_SKEW_MIN_BYTES", "1")
    hot = [k for k in range(3000) if partition_of(key_bytes(k), 4) == 1]  # most records land in partition 1
    records = [{"k": hot[i % len(hot)] if i % 10 else i % 3000, "pad": "p" * 200} for i in range(20_000)]
    counts = collections.Counter(r["k"] for r in records)
    grouped = Dataset.from_list([records[i::3] for i in range(3)]).flat_map(list).group_by(
        by_k, lambda k, items: {"k": k, "n": sum(1 for _ in items)}, num_output_shards=4)
    alone = local_backend.execute(grouped)
    list(alone)
    assert alone.stats[1].num_shards > 4  # alone, it is split

    # the right side partitioned as the group_by partitions, each shard sorted by key
    right = Dataset.from_list([[{"k": k, "tag": -k} for k in sorted(counts) if partition_of(key_bytes(k), 4) == p] for p in range(4)])
    left = grouped.map_shard(lambda items: sorted(items, key=by_k))
    joined = local_backend.execute(left.sorted_merge_join(right.flat_map(list), by_k, by_k))
    assert sorted((r["k"], r["n"], r["tag"]) for r in joined) == sorted((k, n, -k) for k, n in counts.items())


@pytest.fixture
def skew_on_small_data(monkeypatch):
    """Skew splitting on a few thousand records: any partition 4x the median is cut, and runs
    index batches of 4 KiB (an in-process backend's tasks see the smaller batches)."""
    from zephyr.shuffle import runs

    monkeypatch.setenv("ZEPHYR_SKEW_MIN_BYTES", "1")
    monkeypatch.setattr(runs, "BATCH_BYTES", 4096)


def skewed_group_by(num_output_shards: int = 4, records: int = 3_000) -> Dataset:
    """A group_by whose partition 1 holds most records under many keys: cut into key ranges
    (with `skew_on_small_data`) unless something keeps it whole."""
    from zephyr.shuffle.keys import key_bytes, partition_of

    hot = [k for k in range(3000) if partition_of(key_bytes(k), num_output_shards) == 1]
    rows = [{"k": hot[i % len(hot)] if i % 10 else i % 3000, "pad": "p" * 20} for i in range(records)]
    return Dataset.from_list([rows[i::3] for i in range(3)]).flat_map(list).group_by(
        by_k, count_group, num_output_shards=num_output_shards)


def shard_info(items, info):
    yield (info.shard_idx, info.total_shards, sum(1 for _ in items))


def closes_at_100_records(total, group):
    return total + group[1] <= 100, total + group[1]


def count_items(items):
    return sum(1 for _ in items)


SHARD_SEEING = {
    "take_per_shard": lambda ds: ds.take_per_shard(1),
    "window": lambda ds: ds.window(10**6),
    "window_by": lambda ds: ds.window_by(closes_at_100_records, 0),
    "map_shard": lambda ds: ds.map_shard(shard_info),
    "reduce": lambda ds: ds.reduce(count_items, max),  # the largest shard's group count
    "map_then_take": lambda ds: ds.map(lambda g: g[0]).take_per_shard(2),
}


@pytest.mark.parametrize("op", SHARD_SEEING)
def test_a_skewed_group_by_keeps_its_shard_count_for_ops_that_see_shards(local_backend, monkeypatch, skew_on_small_data, op):
    """Regression (issue 38): a skewed partition cut into key ranges ran the ops after the
    group_by once per range, so `group_by(..., num_output_shards=4).take_per_shard(1)` gave 7
    items, map_shard saw total_shards=8, a window closed at every range's end. The oracle: the
    same pipeline with splitting off (ZEPHYR_SKEW_MAX_PIECES=1) means the same."""
    grouped = skewed_group_by()
    alone = local_backend.execute(grouped)
    list(alone)
    assert alone.stats[1].num_shards > 4  # without an op that sees shards it is cut (the fault is there)
    pipeline = SHARD_SEEING[op](grouped)
    execution = local_backend.execute(pipeline)
    got = list(execution)
    if op == "take_per_shard":
        assert len(got) == 4  # one per output shard, as asked
    if op == "map_shard":
        assert [(i, total) for i, total, _ in got] == [(i, 4) for i in range(4)]
    monkeypatch.setenv("ZEPHYR_SKEW_MAX_PIECES", "1")
    assert got == list(local_backend.execute(pipeline))
    assert execution.stats[1].num_shards == 4
    assert "(never cut into key ranges for skew: " in pipeline.plan().describe()  # the plan says why


def test_a_skewed_group_by_written_out_is_still_cut_into_key_ranges(local_backend, monkeypatch, skew_on_small_data, tmp_path):
    """Writers and per-item ops do not see shards whole: their stage is cut (one output per
    key range, `{total}` counting them), and the groups are those of the uncut run."""
    pipeline = skewed_group_by().map(lambda g: {"k": g[0], "n": g[1]})
    execution = local_backend.execute(pipeline.write_jsonl(str(tmp_path / "part-{shard}-of-{total}.jsonl")))
    paths = list(execution)
    pieces = execution.stats[1].num_shards
    assert pieces > 4 and sorted(os.path.basename(p) for p in paths) == sorted(f"part-{i}-of-{pieces}.jsonl" for i in range(pieces))
    written = sorted(line for p in paths for line in Path(p).read_text().splitlines())
    monkeypatch.setenv("ZEPHYR_SKEW_MAX_PIECES", "1")
    assert written == sorted(line for g in local_backend.execute(pipeline) for line in [json.dumps(g, separators=(",", ":"))])


def as_record(group):
    return {"k": group[0], "n": group[1]}


def written_lines(paths) -> list[str]:
    return sorted(line for p in paths for line in Path(p).read_text().splitlines())


@pytest.mark.parametrize("pattern", ["part-{shard:03d}.jsonl", "part-{shard:03d}-of-{total:03d}.jsonl"])
def test_a_rerun_of_a_finished_skewed_write_runs_nothing_upstream(local_backend, skew_on_small_data, tmp_path, pattern):
    """Regression (issue 38): skip_existing judged a cut stage's outputs at its planned 4 shards
    (by name, and by the input each records, "shard i of 19"), so a rerun of a finished run
    ran the map stage and the shuffle again to find every output there."""
    ds = skewed_group_by().map(as_record).write_jsonl(str(tmp_path / "out" / pattern), skip_existing=True)
    first = local_backend.execute(ds)
    paths = list(first)
    assert first.stats[1].num_shards == len(paths) > 4
    written = {p: os.stat(p).st_mtime_ns for p in paths}
    again = local_backend.execute(ds)
    assert list(again) == paths
    assert again.counters["zephyr/stages_skipped_outputs_exist"] == 1  # nothing upstream ran
    assert {p: os.stat(p).st_mtime_ns for p in paths} == written


def test_a_skewed_write_rerun_after_its_input_changed_rewrites_or_refuses_by_its_shard_count(
        local_backend, skew_on_small_data, monkeypatch, tmp_path):
    """Regression (issue 38): after an input change, outputs of the key ranges past the planned 4
    shards stopped the run (StaleOutputsError) though the rerun cut as many ranges and rewrote
    them all. Now they are judged once the shard count is known: rewritten when this run writes
    them; refused, before the stage writes anything, when it cuts fewer ranges."""
    out = str(tmp_path / "out" / "part-{shard:03d}.jsonl")
    paths = list(local_backend.execute(skewed_group_by().map(as_record).write_jsonl(out, skip_existing=True)))
    grown = skewed_group_by(records=3_300).map(as_record)
    rerun = local_backend.execute(grown.write_jsonl(out, skip_existing=True))
    assert list(rerun) == paths and "zephyr/shards_skipped_existing" not in rerun.counters
    expected = written_lines(paths)
    with monkeypatch.context() as uncut:
        uncut.setenv("ZEPHYR_SKEW_MAX_PIECES", "1")
        assert expected == sorted(json.dumps(r, separators=(",", ":")) for r in local_backend.execute(grown))
    monkeypatch.setenv("ZEPHYR_SKEW_MAX_PIECES", "8")  # the next run cuts fewer ranges
    fewer = skewed_group_by(records=3_600).map(as_record).write_jsonl(out, skip_existing=True)
    with pytest.raises(StaleOutputsError, match=r"would not be written .*part-018.jsonl \(made from shard 18 of 19"):
        list(local_backend.execute(fewer))
    assert written_lines(paths) == expected  # nothing rewritten


def four_files(shard, total):
    return f"part-{shard % 4}.jsonl"


def test_a_path_function_that_gives_two_key_ranges_one_path_fails_before_the_stage_writes(local_backend, skew_on_small_data, tmp_path):
    """Regression (issue 38): a path function was checked for the planned 4 shards only; cut
    into 19, shards 0 and 4 wrote one path and the later one silently replaced the other."""
    out = tmp_path / "out"
    ds = skewed_group_by().map(as_record).write_jsonl(lambda shard, total: str(out / four_files(shard, total)))
    with pytest.raises(PlanError, match="gives shards 0 and 4 the same path"):
        list(local_backend.execute(ds))
    assert not list(out.glob("part-*"))


class KeyedIterator:
    """An iterator over a group's items that knows the group's key."""

    def __init__(self, k, items):
        self.k, self._items = k, iter(list(items))

    def __iter__(self):
        return self

    def __next__(self):
        return next(self._items)


def test_a_joined_group_by_reduces_by_group_bys_rule_a_returned_iterator_is_one_item(local_backend):
    """Regression: joined shuffle by shuffle, a group_by whose reducer returned an iterator had it
    flattened into several items, while the same group_by alone yields it as one item (only a
    generator function yields several)."""
    words = Dataset.from_list(["a", "b", "a", "c", "a"])
    left = words.group_by(lambda w: w, KeyedIterator, num_output_shards=2)
    right = words.group_by(lambda w: w, lambda k, items: {"k": k, "n": sum(1 for _ in items)}, num_output_shards=2)
    alone = list(local_backend.execute(left.map(lambda g: (type(g).__name__, g.k))))
    assert sorted(alone) == [("KeyedIterator", "a"), ("KeyedIterator", "b"), ("KeyedIterator", "c")]  # one item per key
    joined = local_backend.execute(left.sorted_merge_join(right, lambda g: g.k, lambda r: r["k"],
                                                          combiner=lambda g, r: (type(g).__name__, list(g), r["n"])))
    assert sorted(joined) == [("KeyedIterator", ["a"] * 3, 3), ("KeyedIterator", ["b"], 1), ("KeyedIterator", ["c"], 1)]


def test_same_output_bytes_twice_and_scratch_is_removed(tmp_path):
    outputs = []
    for run in range(2):
        backend = create_backend("threadpool", progress=False, scratch_dir=str(tmp_path / "scratch"))
        ds = words_dataset().group_by(lambda w: w, count_group, num_output_shards=3).map(lambda g: {"word": g[0], "n": g[1]})
        paths = list(backend.execute(ds.write_jsonl(str(tmp_path / f"run{run}" / "part-{shard}.jsonl"))))
        outputs.append([Path(p).read_bytes() for p in paths])
        assert list((tmp_path / "scratch").iterdir()) == []
    assert outputs[0] == outputs[1]


def test_spills_several_sorted_runs_when_data_exceeds_the_buffer(tmp_path):
    """4 MiB task memory -> 1 MiB map buffer; ~6 MB of records per map shard spill many runs."""
    backend = create_backend("sync", progress=False, memory="4MiB", scratch_dir=str(tmp_path / "s"))
    ds = Dataset.from_list([0, 1]).flat_map(lambda s: ({"k": i % 97, "pad": "p" * 200, "s": s} for i in range(20_000)))
    execution = backend.execute(ds.group_by(lambda r: r["k"], lambda k, items: (k, sum(1 for _ in items)), num_output_shards=4))
    assert dict(execution) == {k: len(range(k, 20_000, 97)) * 2 for k in range(97)}
    assert execution.counters["zephyr/shuffle_runs"] >= 6
    # 2 MiB of reduce-side memory merges at most 4 runs at a time: more runs take extra passes
    assert execution.counters["zephyr/merge_passes"] >= 4


def test_multi_pass_merge_keeps_order_and_first_item(tmp_path):
    """sort_by order and deduplicate's "first by shard and position" survive intermediate runs."""
    backend = create_backend("sync", progress=False, memory="4MiB", scratch_dir=str(tmp_path / "s"))
    ds = Dataset.from_list([0, 1, 2]).flat_map(lambda s: ({"k": i % 5, "v": (i * 7919) % 1000, "s": s, "i": i, "pad": "p" * 300} for i in range(6000)))
    sorted_groups = backend.execute(ds.group_by(lambda r: r["k"], lambda k, items: (k, [r["v"] for r in items]), sort_by=lambda r: r["v"], num_output_shards=2))
    got = dict(sorted_groups)
    assert sorted_groups.counters["zephyr/merge_passes"] >= 1
    assert all(values == sorted(values) and len(values) == 3 * 1200 for values in got.values())
    firsts = list(backend.execute(ds.deduplicate(lambda r: r["k"], num_output_shards=2)))
    assert sorted((r["k"], r["s"], r["i"]) for r in firsts) == [(k, 0, k) for k in range(5)]


@pytest.mark.parametrize("codec", ["", "lz4"])
def test_intermediate_runs_hold_batches_of_the_run_size_and_compress_only_when_asked(tmp_path, monkeypatch, codec):
    """Regression: a merge pass wrote its intermediate run in batches of 8,192 rows whatever
    their size (40 KB documents made 320 MB batches, each held whole by the next pass, which
    budgets 2 MiB per open run), and always LZ4-compressed on the local disk (where map-side
    runs are not: compressing there costs more CPU than it saves)."""
    import numpy as np
    import pyarrow as pa

    from zephyr.shuffle.merge import Chunk
    from zephyr.shuffle.reduce import _write_local_run
    from zephyr.shuffle.runs import BATCH_BYTES

    monkeypatch.setenv("ZEPHYR_SHUFFLE_COMPRESSION", codec)
    rows, doc = 2_000, "a" * 40_000  # 80 MB of one letter: LZ4 makes it a few hundred KB
    table = pa.table({"h": pa.array(np.arange(rows, dtype=np.uint64)), "kb": pa.array([b"k"] * rows, pa.large_binary()),
                      "pos": pa.array(np.arange(rows)), "j": pa.array([doc] * rows, pa.large_string())})
    read = _write_local_run(str(tmp_path / "run.arrow"), iter([Chunk(table, np.arange(rows))]))
    batches = list(read())
    assert pa.Table.from_batches(batches).equals(table)  # the rows, in order
    assert len(batches) > 1 and max(b.nbytes for b in batches) <= BATCH_BYTES + table.nbytes // rows
    size = (tmp_path / "run.arrow").stat().st_size
    assert size < table.nbytes // 10 if codec else size > table.nbytes


@pytest.mark.parametrize("where", ["one shard", "two shards"])
def test_sort_by_values_that_cannot_be_ordered_are_named(local_backend, where):
    """A None among ints within a group: the error named no op ("'<' not supported between
    instances of 'NoneType' and 'int'"); it now says sort_by. With one shard the values meet in
    the map side's sort, with two in the reduce side's merge."""
    rows = [{"k": 1, "v": 3}, {"k": 1, "v": None}]
    shards = [rows] if where == "one shard" else [[rows[0]], [rows[1]]]
    ds = Dataset.from_list(shards).flat_map(list).group_by(lambda r: r["k"], lambda k, items: list(items),
                                                           sort_by=lambda r: r["v"])
    with pytest.raises(ShardError, match=r"group_by\(sort_by=\.\.\.\) returned values that cannot be ordered"):
        list(local_backend.execute(ds))


RESUME_SCRIPT = textwrap.dedent(
    """
    import os, sys
    from zephyr import Dataset, counters, create_backend

    CALLS = []  # user-function calls made by this process (sync/threadpool run in-process)

    def tokenize(i):
        CALLS.append(i)
        counters.increment("map_calls")
        return [{"w": f"w{j % 7}", "shard": i} for j in range(50)]

    def reducer(key, items):
        if os.environ.get("DIE_IN_REDUCE"):
            os._exit(9)  # the driver dies between scatter and reduce
        return {"w": key, "n": sum(1 for _ in items)}

    backend = create_backend(sys.argv[1], progress=False, scratch_dir=sys.argv[3])
    ds = Dataset.from_list(list(range(6))).flat_map(tokenize).group_by(lambda r: r["w"], reducer, num_output_shards=2)
    execution = backend.execute(ds.write_jsonl(sys.argv[2] + "/part-{shard}.jsonl"))
    list(execution)
    print("map_calls", len(CALLS), "resumed", execution.counters["zephyr/map_shards_resumed"])
    print("total_map_calls", execution.counters["map_calls"])
    """
)


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_rerun_after_the_driver_died_resumes_at_the_reduce_stage(tmp_path, backend_name):
    script = tmp_path / "job.py"
    script.write_text(RESUME_SCRIPT)
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    args = [sys.executable, str(script), backend_name, str(out), str(scratch)]
    died = subprocess.run(args, env={**os.environ, "DIE_IN_REDUCE": "1"}, capture_output=True, text=True)
    assert died.returncode == 9
    # no final output yet: at most the hidden temporary of the write the kill interrupted, and
    # the killed run's lease on the directory (its dead pid frees it for the rerun at once)
    assert all((p.name.startswith(".part-") and ".zephyr-tmp-" in p.name) or p.name == ".zephyr-lease" for p in out.iterdir())
    rerun = subprocess.run(args, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    assert "map_calls 0 resumed 6" in rerun.stdout  # the scatter was not redone
    assert "total_map_calls 6" in rerun.stdout  # and its shards' counters came back from the manifests
    assert sorted(p.name for p in out.iterdir() if p.name != RECORD_NAME) == ["part-0.jsonl", "part-1.jsonl"]  # temporaries cleaned
    rows = [line for p in sorted(out.glob("part-*")) for line in p.read_text().splitlines()]
    assert len(rows) == 7
    assert not any(scratch.iterdir())

    clean = tmp_path / "clean"
    fresh = subprocess.run([sys.executable, str(script), backend_name, str(clean), str(tmp_path / "scratch2")], capture_output=True, text=True)
    assert "map_calls 6 resumed 0" in fresh.stdout
    assert [p.read_bytes() for p in sorted(clean.glob("part-*"))] == [p.read_bytes() for p in sorted(out.glob("part-*"))]


SET_KEY_SCRIPT = textwrap.dedent(
    """
    import collections, os, sys
    from zephyr import Dataset, create_backend

    Tags = collections.namedtuple("Tags", "words n")

    def records(shard):
        if shard == 1 and os.environ.get("FAIL_SHARD_1"):
            raise RuntimeError("shard 1 fails on the first run")
        return [{"shard": shard, "i": i} for i in range(3)]

    def key(r):
        return Tags(frozenset(["alpha", "beta", "gamma", "delta", "epsilon"]), r["i"])

    backend = create_backend("sync", progress=False, scratch_dir=sys.argv[2])
    ds = Dataset.from_list([0, 1]).flat_map(records).group_by(key, lambda k, items: {"n": k.n, "shards": sorted(r["shard"] for r in items)}, num_output_shards=1)
    try:
        list(backend.execute(ds.write_jsonl(sys.argv[1] + "/part-{shard}.jsonl")))
    except Exception:
        sys.exit(3)
    """
)


def test_namedtuple_keys_holding_sets_group_alike_in_every_process(tmp_path):
    """Regression: a namedtuple key was pickled, and a set in it pickles in hash order, which
    differs per process; a rerun in a new process (or a Ray worker) resumed shard 0's scatter
    keyed one way and hashed shard 1's another, splitting each group in two."""
    script = tmp_path / "job.py"
    script.write_text(SET_KEY_SCRIPT)
    args = [sys.executable, str(script), str(tmp_path / "out"), str(tmp_path / "scratch")]
    first = subprocess.run(args, env={**os.environ, "PYTHONHASHSEED": "1", "FAIL_SHARD_1": "1"}, capture_output=True, text=True)
    assert first.returncode == 3, first.stderr
    rerun = subprocess.run(args, env={**os.environ, "PYTHONHASHSEED": "2"}, capture_output=True, text=True)
    assert rerun.returncode == 0, rerun.stderr
    lines = (tmp_path / "out" / "part-0.jsonl").read_text().splitlines()
    assert sorted(lines) == [f'{{"n":{i},"shards":[0,1]}}' for i in range(3)]


def test_deduplicate_drops_in_shard_duplicates_before_the_shuffle(local_backend):
    rows = [[("a", 0), ("a", 1), ("b", 2), ("a", 3)], [("b", 4), ("c", 5)]]
    execution = local_backend.execute(Dataset.from_list(rows).flat_map(list).deduplicate(lambda r: r[0]))
    assert sorted(execution) == [("a", 0), ("b", 2), ("c", 5)]
    # 6 records in; the map side already collapsed shard 0's extra "a"s: 4 crossed the shuffle
    assert execution.counters["zephyr/shuffle_records"] == 6
    assert execution.counters["zephyr/combined_records"] == 4


def test_stopping_at_the_last_item_still_finishes_the_run(tmp_path):
    """Regression: scratch was removed (and the summary hook run) only when the caller asked
    for one item past the last, so `next(execute(ds.count()))` leaked the scratch."""
    backend = create_backend("threadpool", progress=False, scratch_dir=str(tmp_path / "scratch"))
    finished = []
    backend.on_finish.append(finished.append)
    execution = backend.execute(words_dataset().count())
    assert next(execution) == len(all_words())
    assert finished == [execution] and execution.finished
    assert not any((tmp_path / "scratch").iterdir())
    assert all(s.elapsed > 0 for s in execution.stats)


def test_keys_of_other_types_compare_by_their_pickle_as_documented(local_backend):
    """docs/zephyr.md: Decimal("1.0") and Decimal("1.00"), equal in Python, are two keys; a key
    function that normalizes them makes one."""
    from decimal import Decimal

    items = [Decimal("1.0"), Decimal("1.00"), Decimal("1.0")]

    def count(key, group):
        return (str(key), sum(1 for _ in group))

    assert sorted(local_backend.execute(Dataset.from_list(items).group_by(lambda d: d, count))) == [("1.0", 2), ("1.00", 1)]
    assert list(local_backend.execute(Dataset.from_list(items).group_by(lambda d: d.normalize(), count))) == [("1", 3)]
