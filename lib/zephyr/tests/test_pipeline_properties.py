"""Generated records through generated pipelines, compared with a plain-Python oracle (`oracle.py`).

Records mix nested dicts and lists, missing and extra keys, int/float/None/str/bool, ints beyond
64 bits, NaN and infinities, astral characters, bytes, tuples and dataclasses. A pipeline is
1-4 ops drawn from map, filter, flat_map, select, window, window_by, take_per_shard, map_shard
(with ShardInfo), group_by (sort_by, combiner), deduplicate, reshard, count, reduce and
sorted_merge_join, in any order, with their functions picked from fixed menus of module-level
functions (picklable, for Ray). Where an op's result depends on which shard holds what after a
shuffle (which the docs leave open), the oracle goes on from Zephyr's shards of the pipeline up
to the shuffle, once they hold the oracle's records in its number of shards. Where the oracle
raises, Zephyr must fail the shard with the same error type (a user error, not a crash of its
own). How a case runs and is compared: `pipeline_check.py`. Half the examples cut every
partition bigger than the median into key ranges, as a skewed one is (`skew_everywhere`), and
`skewed_cases` always shuffles enough keys first that they are; half collect the output as one stream rather than
shard by shard (a final map_shard keeps its stage whole). Writer round trips
(write_jsonl/write_parquet, read back) run on the records the writers handle, and on items
write_jsonl must refuse; the writer defects the suite pinned have named tests below.

CI runs the root conftest's 'ci' profile (fixed seed, 50 examples; Ray: 15; a failure is not shrunk). A longer run:

    HYPOTHESIS_PROFILE=nightly uv run pytest lib/zephyr/tests/test_pipeline_properties.py

(random seeds, 1,000 examples per local test; add `-k "not ray"` to stay off Ray). A failure
prints the shrunk records and pipeline, and a `@reproduce_failure` blob to replay it.
"""

from __future__ import annotations

import dataclasses
import json
import math
import zlib
from typing import Any

import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st

from lib.zephyr.tests import oracle
from lib.zephyr.tests.pipeline_check import Case, checkable_result, collect_shard, expected_result, fresh_backend, run_case
from zephyr import Dataset, ShardError

# ---- records -------------------------------------------------------------------------------


@dataclasses.dataclass
class Point:
    x: Any
    y: Any


FIELDS = ["k", "v", "x", "ü", "𝒳"]
# values that collide under careless key encodings: 1/1.0/True, None/NaN/inf, tuple/list, 0.0/-0.0
TRICKY = [0, 1, 1.0, True, False, None, math.nan, math.inf, -math.inf, 0.0, -0.0, "1", "a", "𝒳",
          2**64, 2**64 + 1, -(2**70), (1, 2), [1, 2], b"a", ""]

text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=6)
scalars = st.one_of(
    st.none(), st.booleans(), st.integers(-5, 5), st.integers(-(2**80), 2**80), st.floats(), text, st.binary(max_size=4)
)
keys = st.one_of(st.sampled_from(TRICKY), st.sampled_from(TRICKY), scalars, st.tuples(scalars, scalars), st.lists(scalars, max_size=2))
values = st.recursive(
    scalars,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.tuples(inner, inner),
        st.dictionaries(st.sampled_from(FIELDS), inner, max_size=3),
        st.builds(Point, inner, inner),
    ),
    max_leaves=6,
)
dict_records = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries({"k": keys}, optional={"v": values, "x": values}) | st.fixed_dictionaries({}, optional={"v": values}),
    st.dictionaries(text, values, max_size=2),
)
records = st.one_of(dict_records, dict_records, dict_records, values)
shards_of_records = st.lists(st.lists(records, max_size=8), min_size=1, max_size=4)


# ---- the function menus (module level: Ray pickles them by reference) ---------------------


def key_k(r):
    return r.get("k") if isinstance(r, dict) else None


def key_bucket(r):
    return zlib.crc32(repr(r).encode()) % 4


def key_type(r):
    return type(r).__name__


def key_whole(r):
    return r


def sort_len(r):
    return len(repr(r))


def sort_neg_bucket(r):
    return -key_bucket(r)


def identity(r):
    return r


def wrap(r):
    return {"k": key_k(r), "v": r}


def tag_bucket(r):
    return (key_bucket(r), r)


def is_dict(r):
    return isinstance(r, dict)


def has_k(r):
    return isinstance(r, dict) and "k" in r


def bucket_even(r):
    return key_bucket(r) % 2 == 0


def twice(r):
    return [r, r]


def nothing(r):
    return []


def spread(r):
    if isinstance(r, dict):
        return list(r.values())
    return list(r) if isinstance(r, (list, tuple)) else [r]


def count_group(k, items):
    return (k, sum(1 for _ in items))


def list_group(k, items):
    return (k, list(items))


def explode_group(k, items):
    for i, r in enumerate(items):
        yield (k, i, r)


def min_item(k, items):
    return min(items, key=oracle.canon)


def min_group(k, items):
    return (k, min_item(k, items))


def count_items(items):
    return sum(1 for _ in items)


def sum_buckets(items):
    return sum(key_bucket(r) for r in items)


def first_or_none(items):
    return next(iter(items), None)


def pair(left, right):
    return (left, right)


def right_key(r):
    return r["j"]


def tag_shard(items, info):
    """map_shard with ShardInfo: which shard of how many each record went through."""
    for r in items:
        yield (info.shard_idx, info.total_shards, r)


def same_type(state, r):
    """window_by: a window holds consecutive records of one type (the first record always stays)."""
    kind = type(r).__name__
    return state is None or state == kind, kind


@dataclasses.dataclass(frozen=True)
class SortedBy:
    """map_shard: the shard sorted by a key (a join's left side must be)."""

    key: Any

    def __call__(self, items):
        return sorted(items, key=self.key)


# ---- pipelines -----------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Step:
    """One op: `Dataset.<name>(*args, **kwargs)` and `oracle.<name>(model, *args, **kwargs)`."""

    name: str
    args: tuple = ()
    kwargs: tuple = ()  # (name, value) pairs

    def __repr__(self) -> str:
        args = [getattr(a, "__name__", repr(a)) for a in self.args]
        args += [f"{k}={getattr(v, '__name__', repr(v))}" for k, v in self.kwargs]
        return f"{self.name}({', '.join(args)})"

    @property
    def shuffles(self) -> bool:
        return self.name in ("group_by", "deduplicate", "reshard", "count", "reduce")

    @property
    def needs_placement(self) -> bool:
        """Whether the result depends on which records are in which shard, in which order:
        the oracle can only model it on an exact dataset."""
        if self.name == "reduce":
            return self.args[1] in (first_or_none, max)
        return self.name in ("window", "window_by", "take_per_shard", "map_shard", "sorted_merge_join")

    @property
    def needs_input_order(self) -> bool:
        """Whether the result depends on which record came first in the pipeline's input (keep-first,
        an order-sensitive reducer's items): the oracle models it where it knows that order."""
        return self.name == "deduplicate" or (self.name == "group_by" and self.args[1] in ORDER_SENSITIVE_REDUCERS)

    def on_dataset(self, ds: Dataset) -> Dataset:
        args = self.args
        if self.name == "sorted_merge_join":  # the right side as a Dataset of those shards
            args = (Dataset.from_list(args[0]).flat_map(list),) + args[1:]
        if self.name == "reduce":
            return ds.reduce(*args)
        return getattr(ds, self.name)(*args, **dict(self.kwargs))

    def on_model(self, model: oracle.Model) -> oracle.Model:
        fn = {"map": oracle.map_, "filter": oracle.filter_}.get(self.name) or getattr(oracle, self.name)
        return fn(model, *self.args, **dict(self.kwargs))


KEYS = [key_k, key_bucket, key_type, key_whole]
ORDER_FREE_REDUCERS = [count_group, min_group]
ORDER_SENSITIVE_REDUCERS = [list_group, explode_group]
right_records = st.builds(lambda j, w: {"j": j, "w": w}, st.integers(0, 3), values)


ALL_OPS = ("map", "filter", "flat_map", "select", "group_by", "reshard", "count", "reduce", "window", "window_by",
           "take_per_shard", "map_shard", "deduplicate", "sorted_merge_join")
KEEP_RECORDS = ("filter", "take_per_shard", "deduplicate", "reshard")  # dicts stay dicts of the same fields


@st.composite
def steps(draw, num_shards: int, allowed=ALL_OPS) -> tuple[Step, int]:
    """One op of the `allowed` kinds valid after a dataset of `num_shards` shards; the op, and
    the shard count after it. Any op may follow any other: where the result depends on
    placement the docs leave open (after a shuffle), `expected_result` takes Zephyr's."""
    kind = draw(st.sampled_from(allowed))
    outputs = draw(st.none() | st.integers(1, 4))
    if kind == "map":
        return Step("map", (draw(st.sampled_from([identity, wrap, tag_bucket])),)), num_shards
    if kind == "filter":
        return Step("filter", (draw(st.sampled_from([is_dict, has_k, bucket_even])),)), num_shards
    if kind == "flat_map":
        return Step("flat_map", (draw(st.sampled_from([twice, nothing, spread])),)), num_shards
    if kind == "select":
        columns = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=3, unique=True))
        return Step("select", tuple(columns)), num_shards
    if kind == "window":
        return Step("window", (draw(st.integers(1, 3)),)), num_shards
    if kind == "window_by":
        return Step("window_by", (same_type, None)), num_shards
    if kind == "take_per_shard":
        return Step("take_per_shard", (draw(st.integers(0, 3)),)), num_shards
    if kind == "map_shard":
        return Step("map_shard", (tag_shard,)), num_shards
    if kind == "reshard":
        n = draw(st.integers(1, 4))
        return Step("reshard", (n,)), n
    if kind == "count":
        return Step("count"), 1
    if kind == "reduce":
        pairs = [(count_items, sum), (sum_buckets, sum), (first_or_none, first_or_none), (count_items, max)]
        return Step("reduce", draw(st.sampled_from(pairs))), 1
    if kind == "deduplicate":
        return Step("deduplicate", (draw(st.sampled_from(KEYS)),), (("num_output_shards", outputs),)), outputs or num_shards
    if kind == "sorted_merge_join":
        right = draw(st.lists(st.lists(right_records, max_size=4), min_size=num_shards, max_size=num_shards))
        right = [sorted(shard, key=right_key) for shard in right]
        how = draw(st.sampled_from(["inner", "left"]))
        combiner = draw(st.sampled_from([None, pair]))
        step = Step("sorted_merge_join", (right, key_bucket, right_key), (("how", how), ("combiner", combiner)))
        return step, num_shards
    # group_by
    reducer = draw(st.sampled_from(ORDER_FREE_REDUCERS + ORDER_SENSITIVE_REDUCERS))
    kwargs = {"num_output_shards": outputs, "sort_by": draw(st.sampled_from([None, sort_len, sort_neg_bucket]))}
    if reducer is min_group and draw(st.booleans()):
        kwargs["combiner"] = min_item
    return Step("group_by", (draw(st.sampled_from(KEYS)), reducer), tuple(kwargs.items())), outputs or num_shards


@st.composite
def pipelines(draw, num_shards: int, allowed=ALL_OPS, min_size=1) -> list[Step]:
    """1-4 ops; a join's left side is sorted by its key first (a map_shard), as the op requires."""
    chosen = []
    for _ in range(draw(st.integers(min_size, 4))):
        step, num_shards = draw(steps(num_shards, allowed))
        if step.name == "sorted_merge_join":
            chosen.append(Step("map_shard", (SortedBy(step.args[1]),)))
        chosen.append(step)
    return chosen


@st.composite
def cases(draw):
    shards = draw(shards_of_records)
    return Case(shards, draw(pipelines(len(shards))), draw(st.booleans()), draw(st.booleans()))


keyed_record = st.builds(lambda k, v: {"k": k, "v": v}, st.integers(0, 30), scalars)


@st.composite
def skewed_cases(draw):
    """A group_by or deduplicate of enough records under enough keys that `skew_everywhere`
    cuts its bigger partitions into key ranges, then any ops (an op that sees shards whole
    right after it keeps it from being cut: the other ops are what let it be cut)."""
    shards = draw(st.lists(st.lists(st.one_of(keyed_record, keyed_record, keyed_record, records), min_size=4, max_size=24),
                           min_size=2, max_size=4))
    outputs = (("num_output_shards", draw(st.integers(2, 4))),)
    key = draw(st.sampled_from([key_k, key_whole]))
    shuffle = draw(st.sampled_from([
        Step("deduplicate", (key,), outputs),
        Step("group_by", (key, draw(st.sampled_from(ORDER_FREE_REDUCERS + ORDER_SENSITIVE_REDUCERS))), outputs),
    ]))
    return Case(shards, [shuffle] + draw(pipelines(outputs[0][1], min_size=0)), True, draw(st.booleans()))


@pytest.mark.parametrize("kind", ["sync", "threadpool"])
@given(case=cases())
def test_generated_pipelines_match_the_oracle(kind, case):
    run_case(kind, case)


@pytest.mark.parametrize("kind", ["sync", "threadpool"])
@given(case=skewed_cases())
def test_pipelines_after_a_skewed_shuffle_match_the_oracle(kind, case):
    """Cutting a partition into key ranges never changes a result (issue 38: the ops after the
    shuffle that see shards, take_per_shard, window, map_shard and reduce, ran once per range)."""
    run_case(kind, case)


@pytest.mark.ray
@settings(max_examples=15)
@given(case=cases())
def test_generated_pipelines_match_the_oracle_on_ray(ray_shared, case):
    run_case("ray", case)


def test_check_fails_when_zephyr_crashes_where_the_oracle_expects_a_user_error(monkeypatch):
    """The checker itself (issue 38): where the oracle raises (a select of a non-dict is a
    TypeError), any exception used to pass. A crash of Zephyr's own (here a KeyError put into
    its select) must not pass for the user's error."""
    from zephyr.plan import ops

    case = Case([[1, {"k": 2}]], [Step("select", ("k",))])
    assert isinstance(expected_result(case, None), TypeError)
    run_case("sync", case)  # as it is: the shard fails with the same TypeError

    def crash(record, columns):
        raise KeyError("zephyr's own bug")

    monkeypatch.setattr(ops, "select_columns", crash)
    with pytest.raises(AssertionError, match="the oracle raised TypeError"):
        run_case("sync", case)


keyed_records = st.lists(st.lists(st.builds(lambda k, v: {"k": k, "v": v}, keys, scalars), max_size=10), min_size=1, max_size=3)
keyed_steps = st.sampled_from([Step("deduplicate", (key_k,)), Step("group_by", (key_k, count_group)), Step("group_by", (key_k, list_group))])


@pytest.mark.parametrize("kind", ["sync", "threadpool"])
@given(shards=keyed_records, step=keyed_steps)
def test_shuffles_tell_apart_keys_that_differ(kind, shards, step):
    """Keys that collide under a careless encoding (None/NaN/inf, tuple/list, 1/1.0/True) stay apart."""
    run_case(kind, Case(shards, [step]))


# ---- through the writers -------------------------------------------------------------------

json_scalars = st.one_of(st.none(), st.booleans(), st.integers(-(2**63), 2**63 - 1), st.floats(allow_nan=False, allow_infinity=False), text)
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(text, inner, max_size=3), max_leaves=6)
json_records = st.builds(
    lambda fixed, extra: {**fixed, **extra},
    st.fixed_dictionaries({"k": json_scalars}, optional={"v": json_values}),
    st.dictionaries(text, json_values, max_size=2),
)
# what write_parquet handles today: every record has the same fields of the same types, no nulls
# (in one field order: Parquet keeps a column order, not each record's key order)
parquet_records = st.builds(
    lambda k, t, score, tags, lang, n: {"k": k, "text": t, "score": score, "tags": tags, "meta": {"lang": lang, "n": n}},
    st.integers(-3, 3), text, st.floats(allow_nan=False), st.lists(text, max_size=2), text, st.integers(-(2**63), 2**63 - 1),
)
# now and then an item that is no record (a number, a string, a list, None): write_jsonl refuses it
json_items = st.one_of(json_records, json_records, json_records, json_values)
WRITERS = {"jsonl": ("write_jsonl", "load_jsonl", json_items), "parquet": ("write_parquet", "load_parquet", parquet_records)}


def written_and_read_back(backend, fmt: str, shards, pipeline, directory) -> list[list[Any]]:
    """Run the pipeline ending in the writer, then read each output file back as one shard."""
    write, load, _ = WRITERS[fmt]
    ds = Dataset.from_list(shards).flat_map(list)
    for step in pipeline:
        ds = step.on_dataset(ds)
    paths = list(backend.execute(getattr(ds, write)(f"{directory}/part-{{shard:05d}}.{fmt}")))
    return list(backend.execute(getattr(Dataset.from_list(paths), load)().map_shard(collect_shard)))


@st.composite
def writer_cases(draw, fmt: str):
    shards = draw(st.lists(st.lists(WRITERS[fmt][2], max_size=6), min_size=1, max_size=3))
    return Case(shards, draw(pipelines(len(shards), allowed=KEEP_RECORDS, min_size=0)))


@pytest.mark.parametrize("kind", ["sync", "threadpool"])
@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
@settings(max_examples=25)
@given(data=st.data())
def test_written_files_read_back_as_the_oracle_says(kind, fmt, data, tmp_path_factory):
    case = data.draw(writer_cases(fmt))
    with fresh_backend(kind) as backend:
        model, want = checkable_result(backend, case)
        directory = tmp_path_factory.mktemp("out")
        if any(not isinstance(r, dict) for shard in want for r in shard):  # load_jsonl could not read it back
            event("refused: not an object")
            with pytest.raises(ShardError, match=r"UnwritableRecordError: .*: record \d+: the item is .*, not a dict"):
                written_and_read_back(backend, fmt, case.shards, case.pipeline, directory)
            for left in directory.glob("part-*"):  # the other shards' outputs, each complete
                assert all(line.startswith("{") for line in left.read_text().splitlines())
            return
        got = written_and_read_back(backend, fmt, case.shards, case.pipeline, directory)
    assert len(got) == len(want)
    if model.exact:
        assert [[oracle.canon(r) for r in shard] for shard in got] == [[oracle.canon(r) for r in shard] for shard in want]
    else:
        assert oracle.bag(r for shard in got for r in shard) == oracle.bag(r for shard in want for r in shard)


def parquet_view(records: list[dict]) -> list[dict]:
    """What Parquet reads back, by its documented rule: every field of every record, in the
    order fields were first seen, a field a record lacks as None (Parquet has no "absent")."""
    fields = list(dict.fromkeys(k for r in records for k in r))
    return [{k: r.get(k) for k in fields} for r in records]


# The writer defects (issue 21) the suite pinned before they were fixed: now they must hold.
def test_write_parquet_keeps_fields_the_first_record_lacks(tmp_path):
    records = [{"id": 1}, {"id": 2, "text": "b"}, {"id": 3, "text": "c", "lang": "en"}]
    with fresh_backend("sync") as backend:
        (got,) = written_and_read_back(backend, "parquet", [records], [], tmp_path)
    assert [oracle.canon(r) for r in got] == [oracle.canon(r) for r in parquet_view(records)]


def test_write_parquet_keeps_a_float_after_ints(tmp_path):
    records = [{"x": i} for i in range(9_000)] + [{"x": 2.7}]
    with fresh_backend("sync") as backend:
        (got,) = written_and_read_back(backend, "parquet", [records], [], tmp_path)
    assert got[-1] == {"x": 2.7} and [r["x"] for r in got[:-1]] == list(range(9_000))  # ints widened exactly


def test_write_jsonl_refuses_nan_and_infinities_instead_of_writing_null(tmp_path):
    with pytest.raises(ShardError, match="record 0") as failed:
        with fresh_backend("sync") as backend:
            written_and_read_back(backend, "jsonl", [[{"x": math.nan}, {"x": math.inf}, {"x": -math.inf}]], [], tmp_path)
    assert "'x'" in str(failed.value)
    assert not list(tmp_path.glob("part-*"))  # nothing written


@pytest.mark.parametrize("via", ["records", "shuffle-copy"])
@pytest.mark.parametrize("item", [7, "seven", [7], (7,), None, 1.5, True], ids=repr)
def test_write_jsonl_refuses_an_item_that_is_not_an_object(local_backend, tmp_path, monkeypatch, via, item):
    """Regression (issue 38, defect 5): ints, strings, lists and None were written as lines
    that load_jsonl refuses (or, with on_bad_record="skip", drops), on the record path and on
    a shuffle's JSON-lines copy. The oracle: only a dict reads back as a record."""
    from zephyr.io.json_records import JsonLines

    copied = []
    blocks = JsonLines.blocks
    monkeypatch.setattr(JsonLines, "blocks", lambda self: copied.append(1) or blocks(self))
    items = [{"id": 0}, {"id": 1}, item, {"id": 3}]
    bad = next(i for i, x in enumerate(items) if not isinstance(x, dict))
    kind = "None" if item is None else type(item).__name__
    ds = Dataset.from_list([items]).flat_map(list)
    ds = ds.reshard(1) if via == "shuffle-copy" else ds
    with pytest.raises(ShardError, match=rf"shard 0 .*UnwritableRecordError: .*out\.jsonl: record {bad}: the item is {kind} "):
        list(local_backend.execute(ds.write_jsonl(str(tmp_path / "out.jsonl"))))
    assert not (tmp_path / "out.jsonl").exists()  # nothing written
    assert bool(copied) == (via == "shuffle-copy" and not isinstance(item, tuple))  # a tuple is not JSON data: it travels pickled
    records = [x for x in items if isinstance(x, dict)]
    (path,) = local_backend.execute(Dataset.from_list([records]).flat_map(list).write_jsonl(str(tmp_path / "ok.jsonl")))
    assert list(local_backend.execute(Dataset.from_list([path]).load_jsonl())) == records


def test_load_jsonl_reads_big_integers_exactly(local_backend, tmp_path):
    records = [{"id": 2**64}, {"id": 2**64 + 1}, {"id": -(2**70)}]
    path = tmp_path / "big.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    got = list(local_backend.execute(Dataset.from_list([str(path)]).load_jsonl()))
    assert [oracle.canon(r) for r in got] == [oracle.canon(r) for r in records]


# ---- regressions the suite found -----------------------------------------------------------


@pytest.mark.parametrize(
    "colliding",
    [
        pytest.param([None, math.nan, math.inf, -math.inf], id="none-nan-infinities"),  # JSON wrote all four as null
        pytest.param([(1, 2), [1, 2]], id="tuple-list"),  # JSON wrote both as [1,2]
        pytest.param([{1: "a"}, {"1": "a"}], id="int-str-dict-keys"),  # JSON wrote both as {"1":"a"}
        pytest.param([Point(1, 2), {"x": 1, "y": 2}], id="dataclass-dict"),  # orjson writes dataclasses as objects
    ],
)
def test_deduplicate_keeps_records_whose_keys_only_json_confuses(local_backend, colliding):
    """Regression: shuffle keys were encoded as JSON, so distinct keys merged and records vanished."""
    rows = [{"k": k, "i": i} for i, k in enumerate(colliding)]
    got = list(local_backend.execute(Dataset.from_list([rows]).flat_map(list).deduplicate(key_k)))
    assert oracle.bag(got) == oracle.bag(rows)


def test_equal_keys_group_together_whatever_their_dict_order_or_object_identity(local_backend):
    """Equal keys must give equal bytes: dict order and shared objects (pickle memo) must not matter."""
    s = "".join(["sh", "ared"])
    keys = [{"a": (1,), "b": 2**70}, {"b": 2**70, "a": (1,)}, (s, s), ("shared", "".join(["sha", "red"]))]
    rows = [{"k": k, "i": i} for i, k in enumerate(keys)]
    got = dict((oracle.canon(k), n) for k, n in local_backend.execute(Dataset.from_list([rows]).flat_map(list).group_by(key_k, count_group)))
    assert sorted(got.values()) == [2, 2]
