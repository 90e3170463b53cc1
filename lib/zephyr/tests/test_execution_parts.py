"""The runner's parts, each alone (issue 22): StageLoop on a task pool, ScratchSpace, RunReport.

The pool here is a real TaskPool: it runs `run_shard` on the real stage program, but finishes
calls in the order a test asks (reversed, to check shard order) and loses or fails chosen
attempts, counting each fault it injected so the tests can assert it landed.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Sequence
from typing import Any

import orjson
import pytest

from zephyr import Dataset, ShardError
from zephyr.errors import TaskLost
from zephyr.execution.pool import Finished, InlinePool, run_inline
from zephyr.execution.report import RunReport
from zephyr.execution.scratch import ScratchSpace
from zephyr.execution.stage_loop import StageLoop, StageStats
from zephyr.status import registry as status_registry
from zephyr.plan import ops as op
from zephyr.plan.compile import compile_plan
from zephyr.shuffle.scatter import ScatterSink
from zephyr.tasks import ShardResult, ShardTask, StageProgram


class _NoProgress:
    def __init__(self):
        self.updates = 0
        self.closed = False

    def update(self, result):
        self.updates += 1

    def close(self):
        self.closed = True


class ScriptedPool(InlinePool):
    """Runs each call when submitted; `wait` hands back the last one first; `faults` maps
    (shard, attempt) to an exception to raise instead of the result."""

    def __init__(self, max_parallelism: int = 4, faults: dict | None = None, max_user_retries: int = 0,
                 max_infra_retries: int = 3):
        self.max_parallelism = max_parallelism
        self.max_user_retries = max_user_retries
        self.max_infra_retries = max_infra_retries
        self.faults = dict(faults or {})
        self.attempts: Counter = Counter()
        self.injected: list = []
        self.most_in_flight = 0
        self._in_flight = 0

    def submit(self, fn: Callable, shared: Any, task: ShardTask) -> Finished:
        self.attempts[task.shard] += 1
        self._in_flight += 1
        self.most_in_flight = max(self.most_in_flight, self._in_flight)
        fault = self.faults.get((task.shard, self.attempts[task.shard]))
        if fault is not None:
            self.injected.append((task.shard, self.attempts[task.shard]))
            return Finished(error=fault)
        return run_inline(fn, shared, task)

    def wait(self, handles: Sequence[Finished], timeout: float | None = None) -> list[Finished]:
        return [handles[-1]]

    def result(self, handle: Finished) -> Any:
        self._in_flight -= 1
        return handle.get()


def _doubling_stage(n: int):
    program = StageProgram(0, (op.Map(lambda x: x * 2),))
    tasks = [ShardTask(0, i, n, f"shard {i}", (i, i + 100)) for i in range(n)]
    return program, tasks


def _loop(pool, n=6, finished=None):
    program, tasks = _doubling_stage(n)
    stats, counters, progress = StageStats(0, "map", n), Counter(), _NoProgress()
    return StageLoop(pool, program, tasks, dict(finished or {}), stats, counters, progress), stats, progress


def test_results_come_in_shard_order_when_tasks_finish_in_reverse():
    pool = ScriptedPool(max_parallelism=3)
    loop, stats, progress = _loop(pool)
    results = list(loop)
    assert [r.shard for r in results] == list(range(6))
    assert [r.items for r in results] == [[2 * i, 2 * (i + 100)] for i in range(6)]  # oracle: doubled inputs
    assert pool.most_in_flight == 3  # the window was full and never exceeded
    assert stats.items_out == 12 and progress.updates == 6 and progress.closed


def test_a_lost_task_is_resubmitted_without_charging_user_retries():
    pool = ScriptedPool(faults={(2, 1): TaskLost("node died"), (2, 2): TaskLost("node died again")})
    loop, stats, _ = _loop(pool)
    results = list(loop)
    assert pool.injected == [(2, 1), (2, 2)]  # both faults landed
    assert [r.shard for r in results] == list(range(6)) and pool.attempts[2] == 3
    assert stats.retries_lost == 2 and stats.retries_user == 0


def test_losses_beyond_the_infra_budget_give_up_naming_the_shard():
    pool = ScriptedPool(max_infra_retries=1, faults={(4, 1): TaskLost("x"), (4, 2): TaskLost("y")})
    loop, _, _ = _loop(pool)
    with pytest.raises(RuntimeError, match="stage 0, shard 4 .* was lost 2 times"):
        list(loop)
    assert pool.injected == [(4, 1), (4, 2)]


def test_a_user_failure_is_retried_then_raised_as_the_shards_error():
    boom = ShardError(0, 1, "shard 1", "ValueError", "bad record", "Traceback ...")
    pool = ScriptedPool(max_user_retries=1, faults={(1, 1): boom, (1, 2): boom})
    loop, stats, _ = _loop(pool)
    with pytest.raises(ShardError, match="bad record"):
        list(loop)
    assert pool.injected == [(1, 1), (1, 2)] and stats.retries_user == 1


def test_finished_shards_are_handed_on_in_place_without_running():
    done = {0: ShardResult(0, ["resumed"]), 3: ShardResult(3, ["resumed too"])}
    pool = ScriptedPool()
    loop, _, _ = _loop(pool, finished=done)
    results = list(loop)
    assert [r.items for r in results][0] == ["resumed"] and results[3].items == ["resumed too"]
    assert set(pool.attempts) == {1, 2, 4, 5}  # only the others ran


def test_scratch_space_binds_roots_finds_finished_maps_and_removes_them(tmp_path):
    out = tmp_path / "out"
    ds = Dataset.from_list(list(range(4))).group_by(lambda x: x % 3, lambda k, xs: (k, sum(xs)))
    plan = compile_plan(ds.write_jsonl(f"{out}/{{shard:05d}}.jsonl"))
    scratch = ScratchSpace(type("B", (), {"scratch_dir": None})(), plan)
    assert scratch.dir == f"{out}/.zephyr-scratch"
    bound = scratch.bind(plan)
    (stage,) = [s for s in bound.stages if isinstance(s.sink, ScatterSink)]
    assert stage.sink.root == f"{scratch.dir}/{stage.fingerprint}"
    assert not scratch.left_by_earlier_run(bound) and scratch.completed_maps(stage) == {}
    # a map shard an earlier run finished: its manifest marks it
    root = tmp_path / "out" / ".zephyr-scratch" / stage.fingerprint
    root.mkdir(parents=True)
    (root / "map-00002.json").write_bytes(orjson.dumps({"map_shard": 2, "counters": {"c": 1}, "runs": []}))
    assert scratch.left_by_earlier_run(bound)
    (done,) = scratch.completed_maps(stage).values()
    assert (done.shard, done.counters) == (2, {"c": 1})
    scratch.remove(bound)
    assert not root.exists() and not (tmp_path / "out" / ".zephyr-scratch").exists()


def test_run_report_publishes_and_writes_the_record_beside_the_outputs(tmp_path):
    plan = compile_plan(Dataset.from_list([1, 2, 3]).write_jsonl(f"{tmp_path}/{{shard:05d}}.jsonl"))
    counters = Counter({"my/counter": 3})
    report = RunReport(plan, "sync(max_parallelism=1)", counters)
    assert report.record is None and report.status.snapshot()["state"] == "pending"
    assert any(r is report.status for r in status_registry.runs())  # published for the status page
    report.succeeded()
    assert report.record == f"{tmp_path}/.zephyr-run.json"
    written = orjson.loads((tmp_path / ".zephyr-run.json").read_bytes())
    assert written["state"] == "succeeded" and written["counters"]["my/counter"] == 3


def test_a_stopped_run_reports_without_writing_a_record(tmp_path):
    plan = compile_plan(Dataset.from_list([1]).write_jsonl(f"{tmp_path}/{{shard:05d}}.jsonl"))
    report = RunReport(plan, "sync", Counter())
    report.ended_early(None, write=False)
    assert report.record is None and not (tmp_path / ".zephyr-run.json").exists()
    assert report.status.snapshot()["state"] not in ("pending", "running", "succeeded")


def test_a_ray_task_error_outside_the_shards_own_wrapping_is_named_by_its_cause():
    """Regression: a Ray task that failed outside `run_shard`'s own wrapping was reported as
    "RayTaskError(AttributeError): ray::_call() ... File ..." cut to 200 characters, so the log
    and the run record showed traceback frames and never the error (seen once in CI)."""
    from ray.exceptions import RayTaskError

    from zephyr.execution.stage_loop import attribute

    remote = "Traceback (most recent call last):\n" + '  File "x.py", line 1, in f\n    g()\n' * 20
    raised = RayTaskError("_call", remote, AttributeError("'NoneType' object has no attribute 'fetch'")).as_instanceof_cause()
    error = attribute(raised, ShardTask(stage=0, shard=3, num_shards=4, label="in-3.jsonl"))
    assert (error.error_type, error.error_message) == ("AttributeError", "'NoneType' object has no attribute 'fetch'")
    assert 'File "x.py", line 1, in f' in error.traceback_text  # the remote frames are kept, in the traceback
    plain = attribute(OSError("disk gone"), ShardTask(stage=0, shard=3, num_shards=4, label="in-3.jsonl"))
    assert (plain.error_type, plain.error_message) == ("OSError", "disk gone")
