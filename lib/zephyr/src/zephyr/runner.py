"""Drives a plan on a backend: bounded windows, retries, shard-order results, counters, progress.

One implementation for every backend. Per stage: keep at most `max_parallelism` tasks in
flight, resubmit a task whose worker was lost (without charging the user's retry budget),
retry a user failure at most `max_user_retries` times and then fail the run with the shard's
error (other in-flight tasks are cancelled), and hand results on in shard order.
Counters of failed attempts are dropped, so totals count each shard exactly once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import cloudpickle

from zephyr.backends.base import Backend, TaskLost
from zephyr.errors import PlanError, ShardError
from zephyr.ops import callable_name
from zephyr.plan import Plan, Stage
from zephyr.progress import make_progress
from zephyr.shard import ShardResult, ShardTask, StageProgram, run_shard

__all__ = ["Execution", "StageStats"]

logger = logging.getLogger("zephyr")


@dataclass
class StageStats:
    index: int
    description: str
    num_shards: int
    items_out: int = 0
    elapsed: float = 0.0
    retries_user: int = 0
    retries_lost: int = 0


class Execution:
    """An iterator over a run's results in shard order, with `.counters` and `.stats`.

    The plan is compiled and checked (picklability of every user function) on creation;
    tasks run as the iterator is consumed. `.counters` and `.stats` are complete once the
    iterator is exhausted.
    """

    def __init__(self, backend: Backend, dataset):
        self.backend = backend
        self.plan: Plan = dataset if isinstance(dataset, Plan) else dataset.plan()
        self.programs = [self._program(stage) for stage in self.plan.stages]
        self.counters: Counter = Counter()
        self.stats: list[StageStats] = []
        self.finished = False
        self._results = self._run()

    def __iter__(self) -> Execution:
        return self

    def __next__(self) -> Any:
        return next(self._results)

    # ---- planning-time checks ----------------------------------------------------------------

    def _program(self, stage: Stage) -> StageProgram:
        program = StageProgram(stage.index, stage.ops, reader=stage.input if not isinstance(stage.input, tuple) else None, sink=stage.sink)
        try:
            cloudpickle.dumps(program)
        except Exception as e:
            culprit = _first_unpicklable(stage)
            raise PlanError(
                f"stage {stage.index}: {culprit} cannot be pickled, so it cannot be sent to workers: "
                f"{type(e).__name__}: {e}. Define it at module level or avoid capturing locks, open files or clients."
            ) from e
        return program

    # ---- running -------------------------------------------------------------------------------

    def _run(self) -> Iterator[Any]:
        started = time.perf_counter()
        previous: list[ShardResult] | None = None
        try:
            for stage, program in zip(self.plan.stages, self.programs):
                tasks = self._tasks(stage, previous)
                final = stage.index == len(self.plan.stages) - 1
                ordered = self._run_stage(stage, program, tasks)
                if final:
                    for result in ordered:
                        yield from result.items or ()
                else:
                    previous = list(ordered)
            self.finished = True
        finally:
            self.elapsed = time.perf_counter() - started
            if self.finished:
                for callback in self.backend.on_finish:
                    callback(self)

    def _tasks(self, stage: Stage, previous: list[ShardResult] | None) -> list[ShardTask]:
        if isinstance(stage.input, tuple):
            return [
                ShardTask(stage.index, i, stage.num_shards, shard.label, shard.items) for i, shard in enumerate(stage.input)
            ]
        return stage.input.tasks(stage, previous)

    def _run_stage(self, stage: Stage, program: StageProgram, tasks: list[ShardTask]) -> Iterator[ShardResult]:
        backend = self.backend
        stats = StageStats(stage.index, stage.describe(), stage.num_shards)
        self.stats.append(stats)
        progress = make_progress(backend.progress, stage)
        shared = backend.share(program)
        pending: deque[ShardTask] = deque(tasks)
        in_flight: dict[Any, ShardTask] = {}
        user_failures: Counter = Counter()
        losses: Counter = Counter()
        finished: dict[int, ShardResult] = {}
        next_shard = 0
        start = time.perf_counter()
        try:
            while pending or in_flight:
                while pending and len(in_flight) < backend.max_parallelism:
                    task = pending.popleft()
                    in_flight[backend.submit(run_shard, shared, task)] = task
                for handle in backend.wait(list(in_flight)):
                    task = in_flight.pop(handle)
                    try:
                        result = backend.result(handle)
                    except TaskLost as e:
                        losses[task.shard] += 1
                        stats.retries_lost += 1
                        if losses[task.shard] > backend.max_infra_retries:
                            raise RuntimeError(
                                f"stage {stage.index}, shard {task.shard} (source: {task.label}) was lost "
                                f"{losses[task.shard]} times (workers or nodes died); giving up"
                            ) from e
                        logger.warning("stage %d shard %d lost (%s); resubmitting", stage.index, task.shard, e)
                        pending.appendleft(task)
                        continue
                    except Exception as e:
                        error = e if isinstance(e, ShardError) else _attribute(e, task)
                        user_failures[task.shard] += 1
                        if user_failures[task.shard] > backend.max_user_retries:
                            if error is e:
                                raise
                            raise error from e
                        stats.retries_user += 1
                        logger.warning("stage %d shard %d failed; retrying (%d/%d)", stage.index, task.shard,
                                       user_failures[task.shard], backend.max_user_retries)
                        pending.appendleft(task)
                        continue
                    finished[task.shard] = result
                    self.counters.update(result.counters)
                    stats.items_out += result.num_items
                    progress.update(result)
                    while next_shard in finished:
                        yield finished.pop(next_shard)
                        next_shard += 1
        finally:
            if in_flight:
                backend.cancel(list(in_flight))
            stats.elapsed = time.perf_counter() - start
            progress.close()


def _attribute(error: Exception, task: ShardTask) -> ShardError:
    """A failure the shard function did not wrap itself (e.g. the worker ran out of memory)."""
    import traceback

    text = "".join(traceback.format_exception(error))
    return ShardError(task.stage, task.shard, task.label, type(error).__name__, str(error), text)


def _first_unpicklable(stage: Stage) -> str:
    for record in stage.ops:
        try:
            cloudpickle.dumps(record)
        except Exception:
            fn = next((v for v in vars(record).values() if callable(v)), None)
            return f"{record.describe()}" + (f" (function {callable_name(fn)})" if fn is not None else "")
    return "the stage's input or sink"
