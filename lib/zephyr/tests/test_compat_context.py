"""The reference project's execution API over our runner: ZephyrContext, ZephyrExecutionResult,
execution_scope, zephyr_worker_ctx, the scoped counters with their aggregations, and the
reference's generator combiner. Oracles are plain Python over the same inputs."""

import pickle
import statistics
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import cloudpickle
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, ShardError, counters
from zephyr.backends.sync import SyncBackend
from zephyr.context import IntraShardExecution, ResourceConfig, ZephyrContext, ZephyrExecutionResult, ZephyrWorkerError, zephyr_worker_ctx

SHARDS = [[3, 1, 4], [1, 5], [], [9, 2, 6]]


def scaled_and_counted(x):
    counters.increment("seen")
    counters.pipeline.update_counter("weight", x)
    counters.pipeline.set_aggregation("peak", counters.Aggregation.MAX)
    counters.pipeline.update_counter("peak", x)
    counters.pipeline.set_aggregation("low", "min")
    counters.pipeline.update_counter("low", x)
    counters.pipeline.set_aggregation("mean", counters.Aggregation.AVERAGE)
    counters.pipeline.update_counter("mean", x)
    counters.stage("tokenize").update_counter("weight", 1)  # same name, another scope: merged in the totals
    return x * zephyr_worker_ctx().get_shared("factor")


def make_ctx(client, tmp_path, **kwargs):
    return ZephyrContext(client=client, max_workers=2, resources=ResourceConfig(cpu=1, ram="512m"),
                         chunk_storage_prefix=str(tmp_path / "chunks"), name="compat", **kwargs)


def test_context_executes_with_shared_objects_and_counters_on_every_backend(backend, tmp_path):
    ctx = make_ctx(backend, tmp_path)
    ctx.put("factor", 10)
    outcome = ctx.execute(Dataset.from_list(SHARDS).flat_map(list).map(scaled_and_counted))
    items = [x for shard in SHARDS for x in shard]
    assert isinstance(outcome, ZephyrExecutionResult)
    assert outcome.results == [x * 10 for x in items]
    user = {k: v for k, v in outcome.counters.items() if not k.startswith("zephyr/")}
    assert user == {"seen": len(items), "weight": sum(items) + len(items), "peak": max(items), "low": min(items),
                    "mean": pytest.approx(statistics.fmean(items))}
    # a shuffle spills under chunk_storage_prefix and leaves nothing there
    grouped = ctx.execute(Dataset.from_list(SHARDS).flat_map(list).group_by(lambda x: x % 2, lambda k, xs: (k, sorted(xs))))
    expected = {k: sorted(x for x in items if x % 2 == k) for k in (0, 1)}
    assert dict(grouped.results) == expected
    assert not list(Path(tmp_path / "chunks").rglob("*"))


def test_dry_run_runs_nothing_and_an_empty_dataset_gives_no_results(tmp_path):
    calls = []
    ctx = make_ctx("sync", tmp_path)
    assert ctx.execute(Dataset.from_list([1, 2]).map(calls.append), dry_run=True) == ZephyrExecutionResult([], {})
    assert calls == []
    assert ctx.execute(Dataset.from_list([])).results == []
    assert ctx.execute(Dataset.from_list([]).count()).results == []  # the reference's count of nothing


def test_a_user_error_is_a_zephyr_worker_error_and_is_not_retried(tmp_path):
    attempts = []

    def lookup(x):
        attempts.append(x)
        return ()[x]

    ctx = make_ctx("sync", tmp_path, max_execution_retries=5)
    with pytest.raises(ZephyrWorkerError, match="IndexError") as caught:
        ctx.execute(Dataset.from_list([0]).map(lookup))
    assert isinstance(caught.value, ShardError) and "lookup" in str(caught.value)
    assert attempts == [0]
    revived = pickle.loads(pickle.dumps(caught.value))
    assert type(revived) is ZephyrWorkerError and str(revived) == str(caught.value)


class LosesItsClusterOnce(SyncBackend):
    """A real sync backend whose first submission fails as a lost cluster connection would."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.failures = 0

    def submit(self, fn, shared, arg):
        if self.failures == 0:
            self.failures += 1
            raise ConnectionError("connection to the cluster was lost")
        return super().submit(fn, shared, arg)


def test_an_infrastructure_failure_reruns_the_pipeline_up_to_max_execution_retries(tmp_path):
    flaky = LosesItsClusterOnce(progress=False)
    assert make_ctx(flaky, tmp_path, max_execution_retries=1).execute(Dataset.from_list([1, 2]).map(str)).results == ["1", "2"]
    assert flaky.failures == 1
    with pytest.raises(ConnectionError, match="cluster was lost"):
        make_ctx(LosesItsClusterOnce(progress=False), tmp_path, max_execution_retries=0).execute(Dataset.from_list([1]))


def shared_value_and_budget(_):
    ctx = zephyr_worker_ctx()
    return ctx.get_shared("value"), ctx.task_memory_bytes


@pytest.mark.parametrize("kind", ["sync", "threadpool"])
def test_execution_scope_runs_other_contexts_on_the_entered_pool(kind, tmp_path):
    pool = ZephyrContext(client=kind, max_workers=1, resources=ResourceConfig(cpu=2, ram="1g"),
                         chunk_storage_prefix=str(tmp_path))

    def child(value):
        borrowed = cloudpickle.loads(cloudpickle.dumps(pool))  # as a child task receives it
        with borrowed.execution_scope():
            with ZephyrContext(resources=ResourceConfig(cpu=1, ram="256m")) as task:
                task.put("value", value)
                return task.execute(Dataset.from_list([None]).map(shared_value_and_budget)).results

    with pool:
        with ThreadPoolExecutor(max_workers=2) as executor:
            assert list(executor.map(child, ["first", "second"])) == [[("first", 256 * 2**20)], [("second", 256 * 2**20)]]
        with pool.execution_scope():
            too_big = ZephyrContext(resources=ResourceConfig(cpu=1, ram="2g"))
            with pytest.raises(ValueError, match="exceed one Zephyr worker"):
                too_big.execute(Dataset.from_list([1]))
        assert pool.execute(Dataset.from_list([7])).results == [7]
        with pytest.raises(RuntimeError, match="borrowed ZephyrContext"):
            cloudpickle.loads(cloudpickle.dumps(pool)).shutdown()
    with pytest.raises(RuntimeError, match="closed ZephyrContext"):
        pool.execute(Dataset.from_list([1]))
    with pytest.raises(RuntimeError, match="entered ZephyrContext"):
        with ZephyrContext(client=kind).execution_scope():
            pass


def test_task_resources_must_fit_one_worker_and_share_its_placement(tmp_path):
    ctx = ZephyrContext(client="sync", max_workers=1, resources=ResourceConfig(cpu=2, ram="1g"), chunk_storage_prefix=str(tmp_path))
    ds = Dataset.from_list([None]).map(lambda _: zephyr_worker_ctx().task_memory_bytes)
    assert ctx.execute(ds, map_task_resources=ResourceConfig(cpu=1, ram="256m"),
                       reduce_task_resources=ResourceConfig(cpu=1, ram="512m")).results == [512 * 2**20]
    with pytest.raises(ValueError, match="must fit one Zephyr worker"):
        ctx.execute(ds, map_task_resources=ResourceConfig(cpu=3, ram="256m"))
    with pytest.raises(ValueError, match="must match the worker pool"):
        ctx.execute(ds, map_task_resources=ResourceConfig(cpu=1, ram="256m", image="another-image"))


def test_shared_objects_are_per_thread_and_a_copy_carries_them(tmp_path):
    ctx = ZephyrContext(client="threadpool", max_workers=2, resources=ResourceConfig(cpu=2, ram="1g"),
                        chunk_storage_prefix=str(tmp_path))
    barrier = threading.Barrier(2)

    def put_then_run(value):
        ctx.put("value", value)
        barrier.wait(timeout=60)  # both threads have put before either runs
        return ctx.execute(Dataset.from_list([None]).map(shared_value_and_budget)).results[0][0]

    with ctx, ThreadPoolExecutor(max_workers=2) as executor:
        assert list(executor.map(put_then_run, ["first", "second"])) == ["first", "second"]
        ctx.put("value", "owner")
        borrowed = cloudpickle.loads(cloudpickle.dumps(ctx))
        borrowed.put("value", "borrower")
        assert borrowed.execute(Dataset.from_list([None]).map(shared_value_and_budget)).results[0][0] == "borrower"
        assert ctx.execute(Dataset.from_list([None]).map(shared_value_and_budget)).results[0][0] == "owner"


def test_worker_context_and_counters_outside_a_task():
    from zephyr import worker_context

    assert worker_context.zephyr_worker_ctx is zephyr_worker_ctx  # the reference's module path
    with pytest.raises(RuntimeError, match="inside a task"):
        zephyr_worker_ctx()
    counters.pipeline.update_counter("x", 3)  # no-ops, as in the reference
    counters.current_stage().set_counter("x", 3)
    assert counters.pipeline.get_counters() == counters.current_stage().get_counters() == counters.get_counters() == {}
    with pytest.raises(NotImplementedError, match="get_shared"):
        ZephyrContext(client="sync").load_memory_store(Dataset.from_list([]), name="t", hash_key=hash, recovery_timeout=1)


def test_intra_shard_execution_is_accepted_and_keeps_one_ordered_shard(tmp_path):
    ctx = make_ctx("threadpool", tmp_path, intra_shard_execution=IntraShardExecution.AUTO)
    assert ctx.execute(Dataset.from_list([list(range(50))]).flat_map(list).map(lambda x: x * 2)).results == \
        [x * 2 for x in range(50)]
    with pytest.raises(ValueError, match="'sometimes'"):
        ZephyrContext(client="sync", intra_shard_execution="sometimes")


def scopes_seen(x):
    counters.stage("tokenize").update_counter("tokens", x)
    counters.pipeline.update_counter("docs", 1)
    counters.pipeline.update_counter("visits", 5)
    counters.pipeline.set_counter("visits", 2)  # overwrites within the shard
    counters.pipeline.set_aggregation("avg", "average")
    counters.pipeline.update_counter("avg", 100)
    counters.pipeline.update_counter("avg", 200)
    counters.pipeline.set_counter("avg", 0)  # restarts the average
    counters.pipeline.update_counter("avg", 100)
    current = counters.current_stage()
    current.update_counter("here", 1)
    return (counters.stage("tokenize").get_counters(), counters.pipeline.get_counters(), current.stage_name,
            current.get_counters())


def test_scoped_counters_inside_one_shard():
    ctx = ZephyrContext(client="sync")
    outcome = ctx.execute(Dataset.from_list([7]).map(scopes_seen))
    tokenize, pipeline, stage_name, here = outcome.results[0]
    assert tokenize == {"tokens": 7}
    assert pipeline == {"docs": 1, "visits": 2, "avg": 50}
    assert stage_name == "stage0" and here == {"here": 1}
    assert {k: outcome.counters[k] for k in ("tokens", "docs", "visits", "avg", "here")} == \
        {"tokens": 7, "docs": 1, "visits": 2, "avg": 50, "here": 1}


def sums_only(x):
    counters.pipeline.update_counter("visits", 5)
    counters.pipeline.set_counter("visits", 2)  # a shard of pipeline sums only: the unsplit fast path
    counters.increment("visits", x)
    return counters.pipeline.get_counters()["visits"]


def test_set_counter_overwrites_a_plain_sum():
    outcome = ZephyrContext(client="sync").execute(Dataset.from_list([[3], [4]]).flat_map(list).map(sums_only))
    assert outcome.results == [5, 6] and outcome.counters["visits"] == 11


def observe_all(x):
    for name, kind in (("max", "max"), ("min", "min"), ("mean", "average"), ("sum", "sum")):
        counters.pipeline.set_aggregation(name, kind)
        counters.pipeline.update_counter(name, x)
    return x


@settings(max_examples=25, deadline=None)
@given(st.lists(st.lists(st.integers(-50, 50), max_size=5), min_size=1, max_size=5))
def test_aggregations_across_shards_fold_like_python(shards):
    items = [x for shard in shards for x in shard]
    got = ZephyrContext(client="threadpool", max_workers=3).execute(Dataset.from_list(shards).flat_map(list).map(observe_all))
    if not items:
        assert not {"max", "min", "mean", "sum"} & set(got.counters)
        return
    assert {k: got.counters[k] for k in ("max", "min", "mean", "sum")} == \
        {"max": max(items), "min": min(items), "mean": pytest.approx(statistics.fmean(items)), "sum": sum(items)}


def distinct_ids(key, items):
    """A combiner in the reference's form: a generator yielding the group's distinct items."""
    seen = set()
    for item in items:
        if item["id"] not in seen:
            seen.add(item["id"])
            yield item


def ids_of(key, items):
    return key, sorted({item["id"] for item in items})


def test_a_generator_combiner_yields_the_groups_partial_items(backend):
    records = [{"key": k, "id": i} for k, i in [("a", 1), ("a", 1), ("a", 2), ("b", 3), ("b", 3), ("b", 3), ("b", 4), ("c", 5)]]
    ds = Dataset.from_list([records[:4], records[4:]]).flat_map(list)
    got = list(backend.execute(ds.group_by(lambda r: r["key"], ids_of, combiner=distinct_ids)))
    expected = {}
    for r in records:
        expected.setdefault(r["key"], set()).add(r["id"])
    assert sorted(got) == sorted((k, sorted(v)) for k, v in expected.items())
    counts = list(backend.execute(ds.group_by(lambda r: r["key"], lambda k, items: (k, sum(items)),
                                              combiner=lambda k, items: iter([sum(1 for _ in items)]),
                                              sort_by=lambda r: r if isinstance(r, int) else 0)))
    assert sorted(counts) == sorted((k, sum(1 for r in records if r["key"] == k)) for k in expected)


def test_status_snapshot_shows_aggregated_counters_without_companions(local_backend):
    execution = local_backend.execute(Dataset.from_list([[3, 9], [4]]).flat_map(list).map(observe_all))
    assert list(execution) == [3, 9, 4]
    snapshot = execution.status.snapshot()
    for counts in (snapshot["counters"], snapshot["stages"][0]["counters"]):
        assert {k: counts[k] for k in ("max", "min", "mean", "sum")} == {"max": 9, "min": 3, "mean": pytest.approx(16 / 3), "sum": 16}
        assert not [k for k in counts if k.startswith("zephyr/aggregation")]


def fails_on_three(x):
    if x == 3:
        raise ValueError(f"poison {x}")
    return {"x": x}


def test_a_context_keeps_its_pools_quarantine_and_price(tmp_path):
    """Regression: a ZephyrContext ran every pipeline fail-fast and unpriced, whatever its pool
    said (`create_backend(..., on_shard_failure="quarantine")`, or `zephyr
    --on-shard-failure=quarantine` around a reference-style script): the poison shard failed
    the run with ZephyrWorkerError instead of being set aside."""
    from zephyr import QuarantinedShardsError, create_backend
    from zephyr.status import read_run_record

    pool = create_backend("sync", progress=False, on_shard_failure="quarantine", max_quarantined=None,
                          price_per_core_hour=0.5)
    out = tmp_path / "out"
    with pytest.raises(QuarantinedShardsError) as caught:
        ZephyrContext(client=pool).execute(Dataset.from_list(list(range(6))).map(fails_on_three)
                                           .write_jsonl(str(out / "p-{shard}.jsonl")))
    assert [q["shard"] for q in caught.value.shards] == [3]
    assert sorted(p.name for p in out.glob("p-*.jsonl")) == [f"p-{i}.jsonl" for i in (0, 1, 2, 4, 5)]
    assert read_run_record(str(out))["price_per_core_hour"] == 0.5
