"""sorted_merge_join of two group_by outputs (the reference project's co-partitioned join),
against a plain-Python join of the two sides' groups."""

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, PlanError, ShardError, create_backend


def by_id(record):
    return record["id"]


def latest(key, items):
    return max(items, key=lambda r: r["v"])


def first(key, items):
    return next(iter(items))


def explode(key, items):
    """A generator reducer: several results per group, all with the group's key."""
    for item in items:
        yield {"id": key, "w": item["w"]}


def python_join(left_records, right_records, left_reduce, right_reduce, how, combine, left_post=lambda r: [r]):
    """Group each side by id, reduce each group, join the results by id: the oracle."""
    def groups(records):
        out = {}
        for r in records:
            out.setdefault(r["id"], []).append(r)
        return out

    def results(reducer, items, key):
        got = reducer(key, iter(items))
        return list(got) if hasattr(got, "__next__") else [got]

    rights = {k: results(right_reduce, items, k) for k, items in groups(right_records).items()}
    joined = []
    for key, items in groups(left_records).items():
        for left in (x for r in results(left_reduce, items, key) for x in left_post(r)):
            matches = rights.get(key, [])
            joined.extend(combine(left, right) for right in matches)
            if not matches and how == "left":
                joined.append(combine(left, None))
    return joined


def canonical(items):
    return sorted(map(repr, items))


def pair(left, right):
    return (left["id"], left["v"], right and right["w"])


records = st.lists(st.fixed_dictionaries({"id": st.integers(0, 6), "v": st.integers(0, 3)}), max_size=12)
right_records = st.lists(st.fixed_dictionaries({"id": st.integers(0, 6), "w": st.integers(0, 3)}), max_size=12)


@settings(max_examples=30, deadline=None)
@given(records, right_records, st.sampled_from(["inner", "left"]), st.integers(1, 4), st.integers(1, 3))
def test_join_of_two_group_bys_matches_a_python_join(left_records, right_records_, how, shards, left_inputs):
    backend = create_backend("threadpool", max_parallelism=3, progress=False)
    try:
        chunks = [left_records[i::left_inputs] for i in range(left_inputs)]
        left = Dataset.from_list(chunks).flat_map(list).group_by(by_id, latest, num_output_shards=shards)
        right = Dataset.from_list([right_records_]).flat_map(list).group_by(by_id, explode, num_output_shards=shards)
        got = list(backend.execute(left.sorted_merge_join(right, by_id, by_id, combiner=pair, how=how)))
    finally:
        backend.close()
    assert canonical(got) == canonical(python_join(left_records, right_records_, latest, explode, how, pair))


def test_reference_shaped_join_on_every_backend(backend):
    docs = [{"id": 1, "text": "hello", "version": 1}, {"id": 1, "text": "hello updated", "version": 2},
            {"id": 2, "text": "world", "version": 1}, {"id": 3, "text": "foo", "version": 1}]
    attrs = [{"id": 1, "quality": 0.9}, {"id": 2, "quality": 0.3}, {"id": 3, "quality": 0.8}, {"id": 4, "quality": 0.1}]
    newest = lambda k, items: max(items, key=lambda x: x["version"])  # noqa: E731
    left = Dataset.from_list(docs).group_by(by_id, newest, num_output_shards=4).map(lambda d: {**d, "seen": True})
    right = Dataset.from_list(attrs).group_by(by_id, first, num_output_shards=4).filter(lambda a: a["quality"] > 0.2)
    got = sorted(backend.execute(left.sorted_merge_join(right, by_id, by_id)), key=by_id)
    assert got == [
        {"id": 1, "text": "hello updated", "version": 2, "seen": True, "quality": 0.9},
        {"id": 2, "text": "world", "version": 1, "seen": True, "quality": 0.3},
        {"id": 3, "text": "foo", "version": 1, "seen": True, "quality": 0.8},
    ]


def count_combiner(key, items):
    yield {"id": key, "n": sum(item.get("n", 1) for item in items)}


def total(key, items):
    return {"id": key, "n": sum(item.get("n", 1) for item in items)}


def test_each_side_keeps_its_combiner_and_sort_by(local_backend):
    left_records = [{"id": i % 3, "t": -i} for i in range(12)]
    right_records = [{"id": i % 4} for i in range(10)]
    left = Dataset.from_list([left_records[:6], left_records[6:]]).flat_map(list).group_by(
        by_id, lambda k, items: {"id": k, "order": [r["t"] for r in items]}, sort_by=lambda r: r["t"], num_output_shards=2)
    right = Dataset.from_list([right_records]).flat_map(list).group_by(by_id, total, combiner=count_combiner, num_output_shards=2)
    got = sorted(local_backend.execute(left.sorted_merge_join(right, by_id, by_id)), key=by_id)
    assert got == [{"id": k, "order": sorted(r["t"] for r in left_records if r["id"] == k),
                    "n": sum(1 for r in right_records if r["id"] == k)} for k in range(3)]


def test_shard_counts_must_match_and_join_keys_must_be_group_keys(local_backend):
    left = Dataset.from_list([{"id": 1}]).group_by(by_id, first, num_output_shards=5)
    right = Dataset.from_list([{"id": 1}]).group_by(by_id, first, num_output_shards=3)
    with pytest.raises(PlanError, match="left group_by has 5 output shards and the right one 3"):
        left.sorted_merge_join(right, by_id, by_id).plan()
    assert issubclass(PlanError, ValueError)
    relabelled = Dataset.from_list([{"id": 1}]).group_by(by_id, lambda k, items: {"id": k + 100}, num_output_shards=5)
    same = Dataset.from_list([{"id": 1}]).group_by(by_id, first, num_output_shards=5)
    with pytest.raises(ShardError, match="left join key of .* is 101, but it came from the group of key 1"):
        list(local_backend.execute(relabelled.sorted_merge_join(same, by_id, by_id)))
    windowed = Dataset.from_list([{"id": 1}]).group_by(by_id, first, num_output_shards=5).window(2)
    with pytest.raises(PlanError, match="not a per-item op"):
        windowed.sorted_merge_join(same, by_id, by_id).plan()


def test_join_keys_of_two_group_bys_match_as_their_group_keys_do(local_backend):
    """Regression: a NaN group key failed the join ("... is nan, but it came from the group of
    key nan") though group_by takes NaN as one key. Keys now match by the shuffle's key bytes:
    NaN joins NaN, and 1, 1.0 and True stay three keys, as in group_by."""
    nan = float("nan")
    left = Dataset.from_list([{"id": nan, "l": 1}, {"id": 1, "l": 2}, {"id": 2.5, "l": 3}]).group_by(by_id, first, num_output_shards=2)
    right = Dataset.from_list([{"id": nan, "r": 1}, {"id": 1.0, "r": 2}, {"id": True, "r": 3}]).group_by(by_id, first, num_output_shards=2)
    got = list(local_backend.execute(left.sorted_merge_join(right, by_id, by_id, how="left")))
    assert sorted(((repr(r["id"]), r["l"], r.get("r")) for r in got)) == [("1", 2, None), ("2.5", 3, None), ("nan", 1, 1)]


def test_a_join_of_a_joins_output_is_refused_when_planned(local_backend):
    """Regression: A.group_by ⋈ B.group_by ⋈ C.group_by passed planning (the second join was taken
    for another joint shuffle of the first one's map stage) and failed at run time with an
    internal wrapper reaching the user's key function; the nested form too."""
    def grouped(n):
        return Dataset.from_list([{"id": i, f"v{n}": n} for i in range(3)]).group_by(by_id, first, num_output_shards=2)

    for ds in (grouped(1).sorted_merge_join(grouped(2), by_id, by_id).sorted_merge_join(grouped(3), by_id, by_id),
               grouped(3).sorted_merge_join(grouped(1).sorted_merge_join(grouped(2), by_id, by_id), by_id, by_id)):
        with pytest.raises(PlanError, match="not a join's output"):
            ds.plan()
