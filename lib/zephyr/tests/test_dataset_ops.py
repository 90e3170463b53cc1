"""Per-item ops against plain-Python references, on every backend; laziness and fusion."""

import pytest

from zephyr import Dataset, counters


def run(backend, ds):
    return list(backend.execute(ds))


def test_map_filter_flat_map_match_python(backend):
    items = list(range(20))
    ds = Dataset.from_list(items).map(lambda x: x * 3).filter(lambda x: x % 2 == 0).flat_map(lambda x: [x, -x])
    expected = [y for x in items for y in ([x * 3, -x * 3] if (x * 3) % 2 == 0 else [])]
    assert run(backend, ds) == expected


def test_results_come_back_in_shard_order(backend):
    # later shards finish first: order must still follow shard index
    def slow_first(x):
        import time

        time.sleep(0.05 * (5 - x))
        return x

    assert run(backend, Dataset.from_list(list(range(6))).map(slow_first)) == list(range(6))


def test_map_shard_sees_the_whole_shard_as_an_iterator(backend):
    ds = Dataset.from_iterable(range(10)).map_shard(lambda it: [sum(it)])
    assert run(backend, ds) == [45]


def test_window_and_take_per_shard(backend):
    ds = Dataset.from_iterable(range(7)).window(3)
    assert run(backend, ds) == [[0, 1, 2], [3, 4, 5], [6]]
    two_shards = Dataset.from_list([range(0, 5), range(10, 15)]).flat_map(list).take_per_shard(2)
    assert run(backend, two_shards) == [0, 1, 10, 11]


def test_take_per_shard_stops_reading_the_shard(local_backend):
    def endless(_):
        n = 0
        while True:
            counters.increment("produced")
            yield n
            n += 1

    execution = local_backend.execute(Dataset.from_list([0]).flat_map(endless).take_per_shard(3))
    assert list(execution) == [0, 1, 2]
    assert execution.counters["produced"] == 3


def test_from_list_gives_one_shard_per_item():
    plan = Dataset.from_list(["a", "b", "c"]).map(str.upper).plan()
    assert plan.num_shards == 3


def test_building_runs_nothing(tmp_path):
    called = []
    ds = Dataset.from_list([1, 2]).map(lambda x: called.append(x)).filter(lambda x: called.append(x))
    ds = ds.write_jsonl(str(tmp_path / "out-{shard}.jsonl"))
    assert called == []
    assert list(tmp_path.iterdir()) == []


def test_consecutive_item_ops_fuse_into_one_stage(tmp_path):
    plan = (
        Dataset.from_list([1, 2, 3])
        .map(str)
        .filter(bool)
        .flat_map(list)
        .window(2)
        .map_shard(iter)
        .write_jsonl(str(tmp_path / "o-{shard}.jsonl"))
        .plan()
    )
    assert len(plan.stages) == 1
    text = plan.describe()
    assert "stage 0 [3 shards]" in text
    for name in ("map(str)", "filter(bool)", "flat_map(list)", "window(2)", "map_shard(iter)", "write_jsonl("):
        assert name in text


def test_builder_never_mutates():
    base = Dataset.from_list([1, 2])
    mapped = base.map(lambda x: x + 1)
    assert base.ops == ()
    assert len(mapped.ops) == 1


@pytest.mark.parametrize(
    "build, message",
    [
        (lambda d: d.map(3), "map fn must be callable"),
        (lambda d: d.window(0), "window size must be a positive integer, got 0"),
        (lambda d: d.take_per_shard(-1), "non-negative"),
        (lambda d: d.load_jsonl(on_bad_record="ignore"), "on_bad_record must be"),
        (lambda d: d.write_jsonl("out/{part}.jsonl"), "unknown field"),
    ],
)
def test_bad_arguments_fail_at_build_time(build, message):
    with pytest.raises((TypeError, ValueError), match=message):
        build(Dataset.from_list([1]))


def test_counters_come_back_with_the_run(backend):
    def keep_even(x):
        if x % 2:
            counters.increment("dropped/odd")
            return False
        return True

    execution = backend.execute(Dataset.from_list(list(range(10))).filter(keep_even))
    assert list(execution) == [0, 2, 4, 6, 8]
    assert execution.counters["dropped/odd"] == 5


def test_counters_are_a_no_op_outside_a_run():
    counters.increment("nothing")  # must not raise


def test_seed_example_shape_runs_on_the_flow_backend(tmp_path):
    """The seed's snippet: flow_backend(), from_list(...).filter(...).map(...), list(execute)."""
    from zephyr import flow_backend, set_flow_backend

    files = [{"input": f"in{i}", "output": str(tmp_path / f"out{i}")} for i in range(3)]
    (tmp_path / "out1").write_text("done")
    processed = []

    set_flow_backend(None)
    backend = flow_backend()
    pipeline = (
        Dataset.from_list(files)
        .filter(lambda f: not (tmp_path / f["output"]).exists())
        .map(lambda f: processed.append(f["input"]))
    )
    list(backend.execute(pipeline))
    assert sorted(processed) == ["in0", "in2"]
    assert backend.name == "threadpool"
