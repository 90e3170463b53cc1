"""Intra-shard execution (`IntraShardExecution.AUTO`): a shard's per-item ops split over several
processes, with the output of one task.

The oracle is plain Python over the same items; that the work really ran in several processes
at once is shown by barriers (an item that waits, with a generous deadline, for one that only
another chunk holds) and by the process ids the items record.
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import textwrap
import time

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephyr import counters
from zephyr.context import IntraShardExecution, ResourceConfig, ZephyrContext
from zephyr.dataset import Dataset
from zephyr.execution.intra_shard import run_split, split_end
from zephyr.plan import ops as op
from zephyr.runners import SubprocessRunner

DEADLINE_S = 120  # a barrier's wait: generous, the other process only has to start and read a few rows


def split_context(client, tmp_path, workers: int = 2, mode=IntraShardExecution.AUTO) -> ZephyrContext:
    return ZephyrContext(client=client, max_workers=workers, resources=ResourceConfig(cpu=1, ram="512m"),
                         intra_shard_execution=mode, stage_runner_factory=SubprocessRunner,
                         chunk_storage_prefix=str(tmp_path / "chunks"))


def wait_for(path: pathlib.Path) -> None:
    deadline = time.monotonic() + DEADLINE_S
    while not path.exists():
        assert time.monotonic() < deadline, f"{path.name} never appeared: the chunks did not run at the same time"
        time.sleep(0.01)


@pytest.mark.parametrize("explicit_schema", [False, True])
def test_one_parquet_file_is_mapped_by_two_processes_at_once_into_one_ordered_output(backend, tmp_path, private_tmp,
                                                                                     explicit_schema):
    source = tmp_path / "input.parquet"
    pq.write_table(pa.table({"id": range(13)}), source, row_group_size=13)
    flag = tmp_path / "row-12-done"

    def transform(row):
        if row["id"] == 12:
            flag.touch()
        if row["id"] == 0:
            wait_for(flag)  # row 0 goes on only once another process has reached row 12
        return {"id": row["id"], "pid": os.getpid(), "value": None if row["id"] < 7 else row["id"]}

    schema = pa.schema([("id", pa.int64()), ("pid", pa.int64()), ("value", pa.int64())]) if explicit_schema else None
    ctx = split_context(backend, tmp_path)
    try:
        ds = Dataset.from_files(str(source)).load_parquet().map(transform)
        paths = ctx.execute(ds.write_parquet(str(tmp_path / "part-{shard}-of-{total}.parquet"), schema=schema)).results
    finally:
        ctx.shutdown()
    assert paths == [str(tmp_path / "part-0-of-1.parquet")]
    rows = pq.read_table(paths[0]).to_pylist()
    assert [(r["id"], r["value"]) for r in rows] == [(i, None if i < 7 else i) for i in range(13)]
    pids = {r["pid"] for r in rows}
    assert len(pids) == 2 and os.getpid() not in pids
    assert list(private_tmp.iterdir()) == []  # chunk files removed


def test_a_reduce_partition_is_split_and_its_chunks_concatenated_in_order(tmp_path):
    flag = tmp_path / "late-value-done"
    n = 20_003

    def transform(value):
        if value == n - 3:
            flag.touch()
        if value == 0:
            wait_for(flag)
        return value * 3

    ctx = split_context("sync", tmp_path)
    try:
        ds = (Dataset.from_list([n]).flat_map(range).reshard(1).map(transform)
              .map_shard(lambda rows, shard: [(shard.shard_idx, shard.total_shards, list(rows))]))
        assert ctx.execute(ds).results == [(0, 1, [3 * v for v in range(n)])]
    finally:
        ctx.shutdown()


def test_shard_wide_ops_after_a_split_see_the_whole_shard(tmp_path):
    sources = []
    for index, ids in enumerate([[], list(range(13)), [0, 1]]):
        path = str(tmp_path / f"input-{index}.parquet")
        pq.write_table(pa.table({"id": pa.array(ids, type=pa.int64())}), path, row_group_size=13)
        sources.append(path)
    ds = (Dataset.from_list(sources).load_parquet().filter(lambda row: row["id"] >= 3).map(lambda row: row["id"])
          .window(4).map_shard(lambda batches, shard: [(shard.shard_idx, shard.total_shards, list(batches))]))
    ctx = split_context("threadpool", tmp_path, workers=7)  # 3 shards, 7 workers: each shard split in 2
    try:
        assert ctx.execute(ds).results == [(0, 3, []), (1, 3, [[3, 4, 5, 6], [7, 8, 9, 10], [11, 12]]), (2, 3, [])]
    finally:
        ctx.shutdown()


def _count_and_double(x):
    counters.increment("seen")
    counters.pipeline.set_aggregation("peak", counters.Aggregation.MAX)
    counters.pipeline.update_counter("peak", x)
    counters.pipeline.set_aggregation("mean", counters.Aggregation.AVERAGE)
    counters.pipeline.update_counter("mean", x)
    return 2 * x


def test_counters_of_the_chunks_add_up_to_the_shards(tmp_path):
    ctx = split_context("sync", tmp_path, workers=3)
    try:
        outcome = ctx.execute(Dataset.from_list([list(range(1000))]).flat_map(list).map(_count_and_double))
    finally:
        ctx.shutdown()
    assert outcome.results == [2 * x for x in range(1000)]
    assert outcome.counters["seen"] == 1000 and outcome.counters["peak"] == 999
    assert outcome.counters["mean"] == pytest.approx(499.5)  # weighted by each chunk's observations


def _fails_on_777(x):
    if x == 777:
        raise ValueError(f"bad item {x}")
    return x


def test_a_chunks_error_fails_the_run_with_the_users_error_and_its_traceback(tmp_path, private_tmp):
    ctx = split_context("sync", tmp_path)
    try:
        with pytest.raises(Exception, match="bad item 777") as caught:
            ctx.execute(Dataset.from_list([list(range(2000))]).flat_map(list).map(_fails_on_777))
    finally:
        ctx.shutdown()
    text = str(caught.value)
    assert "failed with ValueError: bad item 777" in text
    assert "raised in an intra-shard worker process" in text and "in _fails_on_777" in text  # the worker's traceback
    assert list(private_tmp.iterdir()) == []


def _dies_on_300(x):
    if x == 300:
        os._exit(3)
    return x


def test_a_process_that_dies_fails_the_run_naming_its_exit_status(tmp_path):
    ctx = split_context("sync", tmp_path)
    try:
        with pytest.raises(Exception, match="died with exit status 3"):
            ctx.execute(Dataset.from_list([list(range(1000))]).flat_map(list).map(_dies_on_300))
    finally:
        ctx.shutdown()


def test_off_and_shared_objects_keep_each_shard_in_its_task(tmp_path):
    pid = os.getpid()
    ds = Dataset.from_list([list(range(50))]).flat_map(list).map(lambda x: os.getpid())
    for mode, shared in ((IntraShardExecution.OFF, False), (IntraShardExecution.AUTO, True)):
        ctx = split_context("sync", tmp_path, mode=mode)
        if shared:
            ctx.put("factor", 2)
        try:
            assert set(ctx.execute(ds).results) == {pid}
        finally:
            ctx.shutdown()


def test_split_end_stops_at_the_first_op_that_needs_the_whole_shard():
    ops = (op.Map(abs), op.Filter(bool), op.FlatMap(list), op.Window(3), op.Map(abs))
    assert split_end(ops, 0) == 3 and split_end(ops, 3) == 3 and split_end(ops, 4) == 5
    limited = (op.Map(abs), op.Window(3), op.TakePerShard(3), op.Map(abs))
    assert split_end(limited, 0) == 0 and split_end(limited, 3) == 4  # a take_per_shard after the chain: no split


def _mapped(record):
    counters.increment("mapped")
    return record


def test_a_take_per_shard_stage_counts_and_reads_what_a_plain_run_does(tmp_path):
    """The oracle is the same pipeline with intra-shard execution off: a take_per_shard stops
    reading after n items, so the map before it runs on n items, its counters say n, and the
    loader reads no further than the plain task does."""
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps({"id": i}) + "\n" for i in range(5000)))
    pipelines = {
        "list": lambda: Dataset.from_list([list(range(10_000))]).flat_map(list).map(_mapped).take_per_shard(2),
        "jsonl": lambda: Dataset.from_files(str(source)).load_jsonl().map(_mapped).window(2).take_per_shard(3),
    }
    for name, pipeline in pipelines.items():
        outcomes = {}
        for mode in (IntraShardExecution.OFF, IntraShardExecution.AUTO):
            ctx = split_context("sync", tmp_path, workers=4, mode=mode)
            try:
                outcome = ctx.execute(pipeline())
                outcomes[mode] = (outcome.results, dict(outcome.counters))
            finally:
                ctx.shutdown()
        assert outcomes[IntraShardExecution.AUTO] == outcomes[IntraShardExecution.OFF], name
        assert outcomes[IntraShardExecution.OFF][1]["mapped"] == {"list": 2, "jsonl": 6}[name]  # the plain run itself


SCRIPT = '''
import json, os, sys
from dataclasses import dataclass
from zephyr import Dataset
from zephyr.context import IntraShardExecution, ResourceConfig, ZephyrContext


@dataclass
class Doc:  # a class of the user's script: __main__.Doc, which a `python -c` process has not
    id: int
    text: str


def to_docs(ids):
    return [Doc(i, "x" * (i % 5)) for i in ids]


def longer(doc):
    assert type(doc) is Doc
    return Doc(doc.id, doc.text + "!")


def run(mode, ds):
    ctx = ZephyrContext(client="sync", max_workers=2, resources=ResourceConfig(cpu=1, ram="512m"), intra_shard_execution=mode)
    try:
        return ctx.execute(ds).results
    finally:
        ctx.shutdown()


def tag_pid(doc):
    return (doc, os.getpid())


oracle = [longer(doc) for doc in to_docs(range(600))]  # plain Python, no zephyr
report = {}
for name, make in {
    "made in the chunks": lambda: Dataset.from_list([list(range(600))]).flat_map(to_docs).map(longer).map(tag_pid),
    "fed to the chunks": lambda: Dataset.from_list([list(range(600))]).flat_map(to_docs).reshard(1).map(longer).map(tag_pid),
}.items():
    for mode in (IntraShardExecution.OFF, IntraShardExecution.AUTO):
        pairs = run(mode, make())
        report[f"{name} {mode.value}"] = {
            "equal": [doc for doc, _ in pairs] == oracle,  # a dataclass's == also wants the class itself
            "classes": sorted({f"{type(doc).__module__}.{type(doc).__qualname__}" for doc, _ in pairs}),
            "split": os.getpid() not in {pid for _, pid in pairs},
        }
print(json.dumps(report))
'''


def test_items_of_a_class_from_the_users_script_go_through_the_chunk_processes(tmp_path):
    """A script run as `__main__` defines the items' class; the chunk processes (`python -c`) do
    not have it. The oracle is plain Python in the script; the split run's items must be the
    script's own class, made in the chunks or fed to them."""
    script = tmp_path / "user_script.py"
    script.write_text(textwrap.dedent(SCRIPT))
    done = subprocess.run([sys.executable, str(script)], cwd=tmp_path, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    report = json.loads(done.stdout.strip().splitlines()[-1])
    for name, figures in report.items():
        assert figures["equal"] and figures["classes"] == ["__main__.Doc"], (name, figures)
        assert figures["split"] == name.endswith("auto"), (name, figures)


ITEM = st.integers(-1000, 1000)
OPS = st.lists(st.sampled_from(["double", "odd", "pair", "neg"]), min_size=1, max_size=4)
MAKE = {"double": lambda: op.Map(lambda x: 2 * x), "odd": lambda: op.Filter(lambda x: x % 2 == 1),
        "pair": lambda: op.FlatMap(lambda x: [x, x + 1]), "neg": lambda: op.Map(lambda x: -x)}
ORACLE = {"double": lambda xs: [2 * x for x in xs], "odd": lambda xs: [x for x in xs if x % 2 == 1],
          "pair": lambda xs: [y for x in xs for y in (x, x + 1)], "neg": lambda xs: [-x for x in xs]}


@settings(max_examples=6, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(items=st.lists(ITEM, max_size=300), names=OPS, split=st.integers(2, 3))
def test_property_run_split_is_the_plain_python_chain_in_order(items, names, split):
    expected = list(items)
    for name in names:
        expected = ORACLE[name](expected)
    ops = tuple(MAKE[name]() for name in names)
    assert list(run_split(ops, iter(items), split, "stage0")) == expected


def _pid_of(_):
    return os.getpid()


def test_stopping_early_stops_the_processes_and_removes_the_chunks(private_tmp):
    """A consumer that stops (take_per_shard, an error downstream) leaves no process or file."""
    outputs = run_split((op.Map(_pid_of),), iter(range(100_000)), 2, "stage0")
    pids = {next(outputs) for _ in range(50)}
    assert pids and os.getpid() not in pids
    outputs.close()
    for pid in pids:
        with pytest.raises(ProcessLookupError):
            os.kill(pid, 0)
    assert list(private_tmp.iterdir()) == []


def test_a_worker_that_cannot_start_stops_the_others_and_leaves_no_files(private_tmp, monkeypatch):
    from zephyr.execution import intra_shard

    real_popen, started = intra_shard.subprocess.Popen, []

    def second_start_fails(*args, **kwargs):
        if started:
            raise OSError("no more processes")
        started.append(real_popen(*args, **kwargs))
        return started[-1]

    monkeypatch.setattr(intra_shard.subprocess, "Popen", second_start_fails)
    with pytest.raises(OSError, match="no more processes"):
        list(run_split((op.Map(abs),), iter(range(10)), 2, "stage0"))
    assert len(started) == 1  # the fault landed on the second start
    assert started[0].poll() is not None  # and the first worker was stopped
    assert list(private_tmp.iterdir()) == []
