"""Memory from measurement (issue 29): the first tasks of a stage report their peak RSS and the
rest are sized from it; a task that runs out of memory is retried with twice its budget up to
the ceiling, not counted as the user's error.

No test here makes the kernel or Ray's memory monitor kill a worker: on a shared 2-core machine
that is neither fast nor safe. A task "killed for memory" is a real task raising the condition
the runner's classifier sees (`MemoryError`, as an allocation refused under a limit, or Ray's
own `OutOfMemoryError`); Ray's classification of its kill (`ray_errors.out_of_memory_cause`) is
checked on Ray's real exception classes.
"""

from __future__ import annotations

import concurrent.futures as cf
import gc
import json
import math
import os
import threading
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import zephyr
from zephyr import Dataset, ShardError, create_backend
from zephyr.execution.memory import DEFAULT_TASK_MEMORY, HEADROOM, MemorySizer
from zephyr.tasks import TaskUsage

MIB = 1 << 20
GIB = 1 << 30
HOLD = 800 * MIB  # what shard 0 holds: HEADROOM times it is above DEFAULT_TASK_MEMORY, so sizing shows

BACKENDS = ["sync", "threadpool", pytest.param("ray", marks=pytest.mark.ray)]
QUIET_DEADLINE_S = 120


@pytest.fixture(autouse=True)
def no_other_task_measuring():
    """In-process backends measure a task's peak as the process's, and skip resetting it while
    another task of the process runs (`zephyr.execution.usage`). An earlier test's abandoned
    run (a generator not yet collected, its tasks still going) would then lend this test its
    old peak: collect such runs, and wait until no task of this process is measuring."""
    from zephyr.execution import usage

    gc.collect()
    deadline = time.monotonic() + QUIET_DEADLINE_S
    while usage.running():
        assert time.monotonic() < deadline, f"{usage.running()} task(s) of an earlier test still running"
        time.sleep(0.05)


def _backend(name: str, request, **options):
    if name == "ray":
        request.getfixturevalue("ray_shared")
    return create_backend(name, progress=False, max_parallelism=1, **options)


def hold_then_report(items):
    """Shard 0 touches HOLD bytes; every shard reports the budget it ran with."""
    items = list(items)
    if items[0] == 0:
        held = bytearray(HOLD)
        held[:: 4096] = b"x" * len(held[:: 4096])
        del held
    return [{"shard": items[0], "budget": zephyr.task_memory()}]


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_later_tasks_are_sized_from_the_first_tasks_peak(backend_name, request):
    backend = _backend(backend_name, request)
    seen = sorted(backend.execute(Dataset.from_list([0, 1, 2]).map_shard(hold_then_report)), key=lambda r: r["shard"])
    assert seen[0]["budget"] is None  # the first task: nothing measured yet, no memory option
    ceiling = backend.memory_ceiling()
    for later in seen[1:]:
        assert later["budget"] == min(ceiling, later["budget"])
        # shard 0 held HOLD; its measured rise can fall short by pages the process already had resident
        # (earlier tests in the same process), so allow 10% below HOLD, far above a no-measurement budget
        assert later["budget"] >= min(ceiling, int(HOLD * 0.9 * HEADROOM))


NEEDED = 10 * DEFAULT_TASK_MEMORY  # what a shard's records need: 10x what a task assumes without a budget


def hold_records(items):
    """Holds a whole shard's records at once, as a sort or a window does. The records are big
    (NEEDED in all, by their declared sizes): a task whose budget cannot hold them is stopped
    the way a memory limit stops it, by a refused allocation (MemoryError)."""
    items = list(items)
    need = sum(item["bytes"] for item in items)
    budget = zephyr.task_memory() or DEFAULT_TASK_MEMORY
    if need > budget:
        raise MemoryError(f"holding {need} bytes of records in a task with {budget}")
    return [{"shard": items[0]["shard"], "budget": budget}]


def _doublings(need: int, ceiling: int) -> int:
    """Oracle: how many out-of-memory retries until a budget doubling from DEFAULT_TASK_MEMORY
    (capped at the ceiling) holds `need`."""
    budget, retries = DEFAULT_TASK_MEMORY, 0
    while budget < need:
        budget, retries = min(2 * budget, ceiling), retries + 1
    return retries


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_a_stage_of_oversized_records_completes_without_a_memory_setting(backend_name, request):
    """Done-when of issue 29. Before: the MemoryError was the user's failure and the run failed."""
    backend = _backend(backend_name, request, max_user_retries=0)
    ceiling = backend.memory_ceiling()
    need = min(NEEDED, ceiling * 9 // 10)  # Ray's node here may hold less than 10 GiB per task
    records = [{"shard": s, "bytes": need // 4} for s in range(2) for _ in range(4)]
    ds = Dataset.from_list([records[:4], records[4:]]).flat_map(lambda x: x)  # two shards of four records
    execution = backend.execute(ds.map_shard(hold_records))
    seen = list(execution)
    assert sorted(r["shard"] for r in seen) == [0, 1]
    assert all(r["budget"] >= need for r in seen)
    retries = execution.stats[0].cost.retries
    assert retries["user"] == 0
    # each shard doubled its way up from the default (shard 1 may start higher: sized from shard 0's peak)
    assert _doublings(need, ceiling) <= retries["memory"] <= 2 * _doublings(need, ceiling)
    assert execution.stats[0].cost.memory_budget >= need


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_out_of_memory_at_the_ceiling_is_the_users_failure(backend_name, request):
    backend = _backend(backend_name, request, memory="64MiB", max_user_retries=0)
    records = [{"shard": 0, "bytes": 100 * MIB}]
    with pytest.raises(ShardError, match="MemoryError") as raised:
        list(backend.execute(Dataset.from_list([records]).flat_map(lambda x: x).map_shard(hold_records)))
    assert raised.value.shard == 0


def raise_ray_oom_once(items):
    """The first attempt raises Ray's own OutOfMemoryError (what its memory monitor reports)."""
    import ray.exceptions

    items = list(items)
    marker = os.path.join(items[0], "attempted")
    if not os.path.exists(marker):
        open(marker, "w").close()
        raise ray.exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
    return [zephyr.task_memory()]


@pytest.mark.ray
def test_ray_out_of_memory_is_retried_with_a_bigger_ray_request(ray_shared, tmp_path):
    backend = create_backend("ray", progress=False, max_user_retries=0)
    execution = backend.execute(Dataset.from_list([str(tmp_path)]).map_shard(raise_ray_oom_once))
    [budget] = list(execution)
    assert (tmp_path / "attempted").exists()
    assert budget == min(2 * DEFAULT_TASK_MEMORY, backend.memory_ceiling())
    assert execution.stats[0].cost.retries["memory"] == 1 and execution.stats[0].cost.retries["user"] == 0


@pytest.mark.ray
def test_a_zephyr_context_on_ray_sizes_tasks_within_a_nodes_share(ray_shared):
    """Regression: a ZephyrContext run without `ram` took its ceiling from the driver's machine
    (0.8 of it per task at max_workers=1), not the Ray node's share, so budgets grew past what
    a node can give one task (past the whole node: a task Ray can never schedule, a hang).

    Oracle: Ray's own node table. A shard needs the largest power-of-two GiB that fits the node
    (more than the node's share of its 2 CPUs, reached exactly by doubling from 1 GiB, so the
    old code ran it, on a schedulable request): within the share it must fail as out of memory."""
    from zephyr import ZephyrContext
    from zephyr.context import ResourceConfig

    [node] = [n["Resources"] for n in ray_shared.nodes() if n.get("Alive")]
    share = int(node["memory"] * min(1.0, 1 / node["CPU"]))
    need = GIB * 2 ** int(math.log2(node["memory"] / GIB))
    assert share < need <= node["memory"]
    records = [{"shard": 0, "bytes": need}]
    pool = create_backend("ray", progress=False)
    ctx = ZephyrContext(client=pool, max_workers=1, resources=ResourceConfig(ram=None), max_shard_failures=0)
    with pytest.raises(ShardError, match="MemoryError") as raised:
        ctx.execute(Dataset.from_list([records]).flat_map(lambda x: x).map_shard(hold_records))
    assert f"with {pool.memory_ceiling()}" in str(raised.value)  # it failed at the node's share


def hold_and_wait(item):
    """Holds 50 MiB and waits: on a Ray whose memory monitor kills at 1% node memory, it is killed."""
    import time

    held = bytearray(50 * MIB)
    held[:: 4096] = b"x" * len(held[:: 4096])
    time.sleep(60)
    return item


@pytest.mark.slow
@pytest.mark.ray
def test_a_task_rays_memory_monitor_kills_is_retried_with_more_memory_up_to_the_ceiling(ray_cluster):
    """End to end with Ray's real kill: a Ray whose memory monitor kills any task once the node
    uses 1% of its memory (always, here), so every attempt is killed for memory. Each is retried
    with twice the budget (and a Ray request to match) until the ceiling, where the run fails
    naming Ray's OutOfMemoryError; no attempt charges the user's retries."""
    cluster = ray_cluster(num_cpus=1, _system_config={"memory_usage_threshold": 0.01, "memory_monitor_refresh_ms": 50,
                                                      "task_oom_retries": 0})
    cluster.connect()
    backend = create_backend("ray", progress=False, max_user_retries=0, ray_task_retries=0)
    ceiling = backend.memory_ceiling()
    assert ceiling > 2 * DEFAULT_TASK_MEMORY  # room to double at least once on this node
    execution = backend.execute(Dataset.from_list([0]).map(hold_and_wait))
    with pytest.raises(ShardError, match="OutOfMemoryError"):
        list(execution)
    cost = execution.stats[0].cost
    assert cost.retries == {"user": 0, "lost": 0, "storage": 0, "memory": _doublings(ceiling, ceiling)}
    failures = execution.status.snapshot()["failures"]
    # every attempt came back from the backend's classifier of Ray's kill (not from user code)
    assert [(f["cause"], f["error_type"]) for f in failures] == [("memory", "TaskOutOfMemory")] * (cost.retries["memory"] + 1)
    assert failures[-1]["outcome"] == "fatal"


def test_rays_out_of_memory_kill_is_classified_as_memory_not_lost():
    ray_exceptions = pytest.importorskip("ray.exceptions")
    from zephyr.backends.ray_errors import is_lost, out_of_memory_cause

    killed = ray_exceptions.OutOfMemoryError("Task was killed due to the node running low on memory.")
    assert out_of_memory_cause(killed) is killed and not is_lost(killed)
    assert out_of_memory_cause(ray_exceptions.WorkerCrashedError()) is None
    assert out_of_memory_cause(ValueError("no")) is None


@settings(max_examples=50)
@given(ceiling=st.integers(64 * MIB, 64 * GIB), peaks=st.lists(st.integers(0, 32 * GIB), max_size=6),
       ran_with=st.one_of(st.none(), st.integers(MIB, 64 * GIB)))
def test_budgets_stay_within_the_ceiling_and_double_on_out_of_memory(ceiling, peaks, ran_with):
    sizer = MemorySizer(None, lambda: ceiling)
    for peak in peaks:
        sizer.observe(TaskUsage(peak_rss=peak))
    budget = sizer.budget(0)
    if peaks:
        first = peaks[:4]
        assert budget == min(ceiling, max(DEFAULT_TASK_MEMORY, math.floor(max(first) * HEADROOM)))
    else:
        assert budget is None
    grown = sizer.grow(1, ran_with)
    current = min(ran_with or DEFAULT_TASK_MEMORY, ceiling)
    assert grown == (None if current >= ceiling else min(ceiling, 2 * current))
    if grown is not None:
        assert sizer.budget(1) == max(grown, budget or 0) <= ceiling


def test_the_memory_option_is_every_tasks_budget_and_the_ceiling():
    sizer = MemorySizer(512 * MIB, lambda: pytest.fail("the option is the ceiling: no node ceiling needed"))
    sizer.observe(TaskUsage(peak_rss=4 * GIB))
    assert sizer.budget(0) == 512 * MIB
    assert sizer.grow(0, 512 * MIB) is None


BIG = 2_000_000  # bytes of text per record: a chunk of the 256 records the scatter took first is 512 MB


def big_records(_):
    for i in range(200):
        yield {"k": i % 5, "v": "x" * BIG}


def _count(k, items):
    return {"k": k, "n": sum(1 for _ in items)}


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_big_records_keep_the_shuffle_within_its_budget(backend_name, request, tmp_path):
    """Regression (issue 29): the scatter took 256 records before it knew how big a record was,
    and never fewer than 64 per chunk (an Arrow run batch likewise), so 2 MB records put 512 MB
    in a task whose budget was 256 MiB (measured: 1.5 GB peak with a 64 MiB budget). Chunks are
    now sized from the records measured so far, starting small."""
    budget = 256 * MIB
    backend = _backend(backend_name, request, memory=budget)
    ds = (Dataset.from_list([0]).flat_map(big_records).group_by(lambda r: r["k"], _count)
          .write_jsonl(str(tmp_path / "out" / "{shard}.jsonl")))
    execution = backend.execute(ds)
    list(execution)
    assert sum(json.loads(line)["n"] for p in (tmp_path / "out").glob("*.jsonl") for line in p.read_text().splitlines()) == 200
    for stats in execution.stats:
        assert not stats.cost.peak_rss_shared or backend_name == "ray", "another task ran in this process meanwhile"
        assert stats.cost.tasks and stats.cost.rss_rise <= budget, (stats.index, stats.cost.rss_rise)


def _fail_first_spin_others(x):
    if x == 0:
        raise ValueError("first shard fails")
    end = time.monotonic() + 0.002 * x  # the others are still running (or just ending) when it does
    while time.monotonic() < end:
        pass
    return x


def test_interrupted_threadpool_tasks_leave_no_task_counted_as_measuring():
    """Regression: a failing shard interrupts the others (an exception raised in their threads);
    one landing in the measurement's own bookkeeping left it counted as running for good, so
    every later task of the process skipped its peak reset and reported an earlier peak."""
    from zephyr.execution import usage

    backend = create_backend("threadpool", max_parallelism=4, progress=False)
    try:
        for _ in range(150):
            with pytest.raises(ShardError, match="first shard fails"):
                list(backend.execute(Dataset.from_list(list(range(4))).map(_fail_first_spin_others)))
    finally:
        backend.close()
    assert usage.running() == 0


def _open_and_abandon(usage, kept: list):
    """A task interrupted inside the measurement's own bookkeeping: it opened one, and its
    exit never ran; the interrupt's traceback keeps the measurement alive (`kept`)."""
    measurement = usage.measuring()
    kept.append(measurement)
    measurement.__enter__()
    return usage.running()


def test_a_measurement_whose_exit_never_ran_is_forgotten_once_its_task_has_ended():
    """The interruption above lands where it lands; this makes the fault it can cause happen
    every time: a measurement opened and never closed, in a thread that then went on (a pool's
    thread runs the next task). Later tasks are measured as running alone: their peak is reset
    and their usage not marked shared."""
    from zephyr.execution import usage

    kept = []
    with cf.ThreadPoolExecutor(1) as pool:
        open_while_running = pool.submit(_open_and_abandon, usage, kept).result()
        assert open_while_running == 1  # the fault landed: counted while its task ran
        assert usage.running() == 0
        with usage.measuring() as alone:
            assert usage.running() == 1
        assert not alone.usage.shared

        started, release = threading.Event(), threading.Event()

        def running_task():
            with usage.measuring():
                started.set()
                assert release.wait(QUIET_DEADLINE_S)

        other = pool.submit(running_task)
        try:
            assert started.wait(QUIET_DEADLINE_S)
            with usage.measuring() as beside:  # one really running is still counted
                assert usage.running() == 2
        finally:
            release.set()
        other.result()
        assert beside.usage.shared
