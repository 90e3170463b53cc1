"""Drives a plan on a backend: bounded windows, retries, shard-order results, counters, progress.

One implementation for every backend. Per stage: keep at most `max_parallelism` tasks in
flight, resubmit a task whose worker was lost (without charging the user's retry budget), and
one that hit a transient storage error likewise but after a backoff, retry a user failure at
most `max_user_retries` times and then fail the run with the shard's error (other in-flight
tasks are cancelled), and hand results on in shard order.
Counters of failed attempts are dropped, so totals count each shard exactly once.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import sys
import tempfile
import time
import warnings
import weakref
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass, replace
from typing import Any

import cloudpickle
import orjson

from zephyr.backends.base import Backend, TaskLost
from zephyr.backends.sync import SyncBackend
from zephyr.counters import Totals
from zephyr.errors import PlanError, ShardError
from zephyr.io.files import expand_glob, remove_empty_dir, remove_temporaries_for, url_to_fs
from zephyr.io.temporaries import sweep_dead_temporaries
from zephyr.ops import WRITE_OPS, callable_name
from zephyr.plan import Plan, Stage, stage_output_paths
from zephyr.progress import make_progress
from zephyr.provenance import outputs_current, refuse_stale_outputs, report_kept, shard_source, writer_codes
from zephyr.retry import BackoffQueue, backoff_delay
from zephyr.run_lock import OutputBusyError, RunLocks
from zephyr.scratch import mark_root, owner_of, remove_older_roots, remove_roots
from zephyr.shard import ShardResult, ShardTask, StageProgram, run_shard
from zephyr.shuffle import ScatterSink
from zephyr.status import registry as status_registry
from zephyr.status.model import RunStatus
from zephyr.status.observe import ObservedBackend
from zephyr.status.record import final_output_dir, record_path_for, write_run_record

__all__ = ["Execution", "NotPicklableWarning", "StageStats"]

logger = logging.getLogger("zephyr")

INTERRUPT_DRAIN = 10.0  # seconds an interrupted run waits for its cancelled tasks to end


@dataclass
class StageStats:
    index: int
    description: str
    num_shards: int
    items_out: int = 0
    elapsed: float = 0.0
    retries_user: int = 0
    retries_lost: int = 0
    resumed: int = 0
    largest_partitions: list = dataclasses.field(default_factory=list)  # after a shuffle: the biggest inputs (run_index.PartitionInfo)


class Execution:
    """An iterator over a run's results in shard order, with `.counters` and `.stats`, and
    `.status` (its live state: `status.snapshot()`, see `zephyr.status`) and `.run_record`
    (the path of the `.zephyr-run.json` written when it ended, if any).

    The plan is compiled and checked on creation (on Ray, every user function must pickle;
    the in-process backends only warn once per function that such a pipeline cannot run on
    Ray, and pickle a stage to check it only until it pickled once in this process, by its
    fingerprint); tasks run as the iterator is consumed. `.counters` and `.stats` are
    complete (and scratch removed) once every shard has finished, i.e. before the last item
    is handed out.
    """

    def __init__(self, backend: Backend, dataset):
        self.backend = backend
        plan: Plan = dataset if isinstance(dataset, Plan) else dataset.plan()
        self.scratch_dir = scratch_dir_for(backend, plan)
        self._scratch_is_ours = not getattr(backend, "scratch_dir", None) and not os.environ.get("ZEPHYR_SCRATCH_DIR")
        self.plan = _bind_scratch(plan, self.scratch_dir)
        if "://" not in self.scratch_dir and any(isinstance(s.sink, ScatterSink) for s in self.plan.stages):
            if backend.spans_machines():
                logger.warning(
                    "zephyr: shuffle scratch %s is a local path but tasks run on several machines; "
                    "reduce tasks elsewhere will not find the map output. Set scratch_dir (or "
                    "ZEPHYR_SCRATCH_DIR, or --scratch-dir) to shared storage such as gs://bucket/scratch",
                    self.scratch_dir,
                )
        self._owner = owner_of(self.plan)  # marks this pipeline's scratch roots (`zephyr.scratch`)
        for item in self.plan.not_resumable():
            logger.warning("zephyr: stage %d cannot be resumed by a rerun, so its shuffle output is removed when the "
                           "run ends: %s", item["stage"], item["reason"])
        self.programs = [self._program(stage) for stage in self.plan.stages]
        self.counters: Counter = Totals()  # sums, or max/min/average where a shard asked for it
        self.stats: list[StageStats] = []
        self.finished = False
        self.elapsed = 0.0
        self._started = time.perf_counter()
        # the live state the status page and the run record show (zephyr.status)
        self.status = RunStatus(self.plan, backend.describe(), self.counters, record_path_for(self.plan))
        self.run_record: str | None = None  # the record's path, once written
        self._locks = RunLocks(None, [])  # taken when the run starts (_hold_outputs)
        status_registry.publish(self.status)
        self._results = self._published(self._run())

    def __iter__(self) -> Execution:
        return self

    def __next__(self) -> Any:
        return next(self._results)

    # ---- planning-time checks ----------------------------------------------------------------

    def _program(self, stage: Stage) -> StageProgram:
        program = StageProgram(stage.index, stage.ops, reader=stage.input if not isinstance(stage.input, tuple) else None, sink=stage.sink,
                               codes=writer_codes(stage))
        in_process = not self.backend.requires_pickling
        if in_process and stage.fingerprint in _pickled_in_process:
            return program  # in-process the check only feeds a warning: pickle a big capture once
        try:
            cloudpickle.dumps(program)
        except Exception as e:
            culprit, fn = _first_unpicklable(stage)
            if not self.backend.requires_pickling:  # nothing leaves this process: run it as given
                _warn_not_picklable(culprit, fn, e)
                return program
            raise PlanError(
                f"stage {stage.index}: {culprit} cannot be pickled, so it cannot be sent to workers: "
                f"{type(e).__name__}: {e}. Define it at module level or avoid capturing locks, open files or clients "
                "(share large objects with backend.put(name, obj) and zephyr.get_shared(name))."
            ) from e
        if in_process and stage.fingerprint:
            _pickled_in_process.add(stage.fingerprint)
        return program

    # ---- running -------------------------------------------------------------------------------

    def _run(self) -> Iterator[Any]:
        started = time.perf_counter()
        self._hold_outputs()
        sweep_dead_temporaries()  # what killed runs left in this machine's temp dir
        previous: list[ShardResult] | None = None
        first = 0
        current = _final_outputs_exist(self.plan) and not self._scratch_exists()
        if current and len(self.plan.stages) > 1:
            # every output of a skip_existing writer is there: nothing upstream needs to run
            first = len(self.plan.stages) - 1
            self.counters["zephyr/stages_skipped_outputs_exist"] += first
        self._started = started
        for stage, program in list(zip(self.plan.stages, self.programs))[first:]:
            if isinstance(stage.sink, ScatterSink):
                mark_root(stage.sink.root, self._owner, stage.fingerprint)
            tasks = self._tasks(stage, previous)
            previous = None  # the map summaries are in the reduce tasks now; free them
            if len(tasks) != stage.num_shards:  # a skewed partition was cut into key ranges
                stage = self._resize(stage, len(tasks))
            final = stage.index == len(self.plan.stages) - 1
            # nothing to run but the existence checks: do them here, starting no workers (or Ray)
            in_process = final and current and _ends_in_skip_writer(stage)
            ordered = self._run_stage(stage, program, tasks, in_process)
            if not final:
                previous = list(ordered)
                _remove_write_temporaries(stage)
                continue
            for result in ordered:
                if result.shard == stage.num_shards - 1:
                    # every task is done: finish now, so that a caller who stops at the last
                    # item (next(), zip, islice) still gets scratch removed and the summary
                    self._finish()
                yield from result.items or ()
        self._finish()

    def _resize(self, stage: Stage, num_shards: int) -> Stage:
        resized = replace(stage, num_shards=num_shards)
        self.plan = replace(self.plan, stages=tuple(resized if s.index == stage.index else s for s in self.plan.stages))
        return resized

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        _remove_write_temporaries(self.plan.stages[-1])
        self._remove_scratch()
        self.elapsed = time.perf_counter() - self._started
        self.status.succeeded()
        self._write_run_record()
        report_kept(self.counters)
        self._locks.release()
        for callback in self.backend.on_finish:
            callback(self)

    def _published(self, results: Iterator[Any]) -> Iterator[Any]:
        """`results`, telling the status when the run fails or its caller stops early."""
        try:
            yield from results
        except GeneratorExit:
            self.status.ended_early(None)
            self._remove_unresumable_scratch()
            raise
        except BaseException as e:
            self.status.ended_early(e)
            self._remove_unresumable_scratch()  # a nonce root is this run's alone, busy or not
            if not isinstance(e, OutputBusyError):  # the record there is the other run's
                self._write_run_record()
            raise
        finally:
            self._locks.release()

    def _hold_outputs(self) -> None:
        """Take this run's leases (`zephyr.run_lock`: another run into the same output fails
        fast, one sharing its scratch waits), then refuse to go on when a skip_existing
        writer's directory holds outputs of inputs that are gone (`zephyr.provenance`)."""
        output_dir = final_output_dir(self.plan)
        shared = self.scratch_dir != f"{output_dir}/.zephyr-scratch"
        roots = [s.sink.root for s in self.plan.stages if isinstance(s.sink, ScatterSink)] if shared else []
        self._locks = RunLocks(output_dir, roots)
        self._locks.acquire()
        refuse_stale_outputs(self.plan.stages)

    def _write_run_record(self) -> None:
        """The final snapshot beside the outputs (`.zephyr-run.json`), for `zephyr status DIR`."""
        path = self.status.record_path
        if path is not None and write_run_record(self.status.snapshot(), path):
            self.run_record = path

    def _tasks(self, stage: Stage, previous: list[ShardResult] | None) -> list[ShardTask]:
        memory = self.backend.task_resources.memory
        if isinstance(stage.input, tuple):
            return _with_sources(self.plan.stages, stage, [
                ShardTask(stage.index, i, stage.num_shards, shard.label, shard.items, memory, shard.path)
                for i, shard in enumerate(stage.input)
            ])
        tasks = stage.input.tasks(stage, previous)  # a list that may carry `largest` (partitions)
        for i, task in enumerate(tasks):
            tasks[i] = replace(task, memory=memory)
        return _with_sources(self.plan.stages, stage, tasks)

    def _completed_scatter(self, stage: Stage) -> dict[int, ShardResult]:
        """Map shards of a scatter stage whose manifest exists: finished by an earlier run."""
        if not isinstance(stage.sink, ScatterSink):
            return {}
        done = {}
        for path in expand_glob(f"{stage.sink.root}/map-*.json"):
            fs, fs_path = url_to_fs(path)
            summary = orjson.loads(fs.cat_file(fs_path))
            shard = summary["map_shard"]
            done[shard] = ShardResult(shard=shard, items=None, counters=summary.get("counters", {}), summary=summary)
        return done

    def _scratch_exists(self) -> bool:
        """An unfinished earlier run left scratch: its outputs may be incomplete (a stage whose
        partitions were split writes more shards than the plan says), so resume it instead."""
        for stage in self.plan.stages:
            if isinstance(stage.sink, ScatterSink):
                fs, root = url_to_fs(stage.sink.root)
                if fs.exists(root):
                    return True
        return False

    def _remove_scratch(self) -> None:
        """This run's scratch, and what earlier runs of the same pipeline left (`zephyr.scratch`)."""
        roots = [stage.sink.root for stage in self.plan.stages if isinstance(stage.sink, ScatterSink)]
        remove_roots(roots)
        remove_older_roots(self.scratch_dir, self._owner, set(roots))
        if self._scratch_is_ours:  # the default folder beside the output: gone once empty
            remove_empty_dir(self.scratch_dir)

    def _remove_unresumable_scratch(self) -> None:
        """A failed or stopped run keeps its scratch for a rerun, except where none can use it."""
        remove_roots([s.sink.root for s in self.plan.stages if isinstance(s.sink, ScatterSink) and s.not_resumable])

    def _run_stage(self, stage: Stage, program: StageProgram, tasks: list[ShardTask],
                   in_process: bool = False) -> Iterator[ShardResult]:
        backend = self.backend if not in_process else SyncBackend(1, max_user_retries=0, progress=False)
        stats = StageStats(stage.index, stage.describe(), stage.num_shards)
        stats.largest_partitions = list(getattr(tasks, "largest", ()))
        self.stats.append(stats)
        progress = make_progress(self.backend.progress, stage, stats.largest_partitions)
        finished: dict[int, ShardResult] = self._completed_scatter(stage)
        if finished:
            self.counters["zephyr/map_shards_resumed"] += len(finished)
            stats.resumed = len(finished)
            for result in finished.values():
                self.counters.update(result.counters)
                progress.update(result)
        backend = ObservedBackend(backend, self.status, stage.index, list(finished.values()))
        shared = backend.share(program) if len(finished) < len(tasks) else None
        pending: deque[ShardTask] = deque(t for t in tasks if t.shard not in finished)
        in_flight: dict[Any, ShardTask] = {}
        backing_off = BackoffQueue()
        user_failures: Counter = Counter()
        losses: Counter = Counter()
        next_shard = 0
        start = time.perf_counter()
        closed = False

        def close_stage() -> None:
            nonlocal closed
            if not closed:
                closed = True
                stats.elapsed = time.perf_counter() - start
                progress.close()

        try:
            while next_shard in finished:
                next_shard += 1
                if next_shard == stage.num_shards:
                    close_stage()
                yield finished.pop(next_shard - 1)
            while pending or in_flight or backing_off:
                pending.extendleft(reversed(backing_off.due()))
                while pending and len(in_flight) < backend.max_parallelism:
                    task = pending.popleft()
                    in_flight[backend.submit(run_shard, shared, task)] = task
                if not in_flight:  # only shards backing off after a storage error
                    time.sleep(backing_off.seconds_to_next())
                    continue
                for handle in backend.wait(list(in_flight), timeout=backing_off.seconds_to_next()):
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
                        if error.transient:  # storage trouble, not the user's: a lost attempt, with backoff
                            losses[task.shard] += 1
                            stats.retries_lost += 1
                            self.counters["zephyr/storage_retries"] += 1
                            if losses[task.shard] > backend.max_infra_retries:
                                if error is e:
                                    raise
                                raise error from e
                            delay = backoff_delay(losses[task.shard], backend.retry_backoff)
                            logger.warning("stage %d shard %d: transient storage error (%s: %s); retrying in %.1fs",
                                           stage.index, task.shard, error.error_type, error.error_message[:200], delay)
                            backing_off.push(task, delay)
                            continue
                        user_failures[task.shard] += 1
                        if user_failures[task.shard] > backend.max_user_retries:
                            if error is e:
                                raise
                            raise error from e
                        stats.retries_user += 1
                        logger.warning("stage %d shard %d failed with %s: %s%s; retrying (%d/%d) in case the worker, not "
                                       "the code, was at fault (max_user_retries=0 fails at once)", stage.index, task.shard,
                                       error.error_type, error.error_message[:200], f" at {error.record}" if error.record else "",
                                       user_failures[task.shard], backend.max_user_retries)
                        pending.appendleft(task)
                        continue
                    finished[task.shard] = result
                    self.counters.update(result.counters)
                    stats.items_out += result.num_items
                    progress.update(result)
                    while next_shard in finished:
                        next_shard += 1
                        if next_shard == stage.num_shards:
                            close_stage()  # before the last result is handed on
                        yield finished.pop(next_shard - 1)
        finally:
            if in_flight:  # a fatal error, an interrupt (SIGINT/SIGTERM), or the caller stopped iterating
                backend.cancel(list(in_flight))
                interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
                backend.drain(list(in_flight), **({"timeout": INTERRUPT_DRAIN} if interrupted else {}))
            close_stage()


def scratch_dir_for(backend: Backend, plan: Plan) -> str:
    """Where scatter runs go: the backend's `scratch_dir`, else $ZEPHYR_SCRATCH_DIR, else a
    `.zephyr-scratch` folder beside the pipeline's final output, else the local temp dir.

    On a multi-node cluster it must be storage every worker sees (e.g. a `gs://` prefix).
    """
    if getattr(backend, "scratch_dir", None):
        return backend.scratch_dir.rstrip("/")
    if os.environ.get("ZEPHYR_SCRATCH_DIR"):
        return os.environ["ZEPHYR_SCRATCH_DIR"].rstrip("/")
    directory = final_output_dir(plan)
    if directory is not None:
        return f"{directory}/.zephyr-scratch"
    return os.path.join(tempfile.gettempdir(), "zephyr-scratch")


def _bind_scratch(plan: Plan, scratch_dir: str) -> Plan:
    stages = tuple(
        replace(s, sink=replace(s.sink, root=f"{scratch_dir}/{s.fingerprint}")) if isinstance(s.sink, ScatterSink) else s
        for s in plan.stages
    )
    return replace(plan, stages=stages)


def _remove_write_temporaries(stage: Stage) -> None:
    """Once a stage's outputs are all written, temporaries of earlier or killed attempts of
    those outputs are litter: remove them with one listing per output directory."""
    paths = [path for record in stage.ops if isinstance(record, WRITE_OPS) for path in stage_output_paths(stage, record)]
    if paths:
        remove_temporaries_for(paths)


def _final_outputs_exist(plan: Plan) -> bool:
    """True when the final stage ends in a skip_existing writer whose every shard output
    exists, made from that shard's input now (`provenance.outputs_current`): then nothing
    upstream needs to run. One listing per output directory, then the sidecars there."""
    return outputs_current(plan.stages, plan.stages[-1])


def _ends_in_skip_writer(stage: Stage) -> bool:
    """The stage's last op is a skip_existing writer: when its every output is current, a shard
    task only checks that its output exists (no user code runs), so it can run in the driver."""
    return stage.sink is None and bool(stage.ops) and isinstance(stage.ops[-1], WRITE_OPS) and stage.ops[-1].skip_existing


def _with_sources(stages, stage: Stage, tasks: list[ShardTask]) -> list[ShardTask]:
    """Tasks of a stage with skip_existing writers, each told what its shard reads (the
    identity its outputs' provenance records); `tasks` (a list that may carry attributes)
    is updated in place."""
    if any(isinstance(r, WRITE_OPS) and r.skip_existing for r in stage.ops):
        for i, task in enumerate(tasks):
            tasks[i] = replace(task, source=shard_source(stages, stage, task.shard, len(tasks)))
    return tasks


_pickled_in_process: set[str] = set()  # fingerprints of stages an in-process run found picklable
_warned: weakref.WeakSet = weakref.WeakSet()  # functions warned about in this process
_warned_names: set[str] = set()  # culprits without a function object to hold on to


def _warn_not_picklable(culprit: str, fn: Any, error: Exception) -> None:
    """Once per function and process: the pipeline runs here, but could not run on Ray."""
    try:
        if fn in _warned:
            return
        _warned.add(fn)
    except TypeError:  # not weak-referenceable (or None): remember the description instead
        if culprit in _warned_names:
            return
        _warned_names.add(culprit)
    warnings.warn(
        f"{culprit} cannot be pickled ({type(error).__name__}: {error}); it runs on this in-process "
        "backend, but this pipeline will not run on the ray backend",
        NotPicklableWarning,
        stacklevel=2,
    )


class NotPicklableWarning(UserWarning):
    """A pipeline function cannot be pickled: fine in-process, refused by the Ray backend."""


def _attribute(error: Exception, task: ShardTask) -> ShardError:
    """A failure the shard function did not wrap itself (e.g. the worker ran out of memory)."""
    import traceback

    text = "".join(traceback.format_exception(error))
    return ShardError(task.stage, task.shard, task.label, type(error).__name__, str(error), text)


def _first_unpicklable(stage: Stage) -> tuple[str, Any]:
    """The op (and function) that cannot be pickled, described, and the function (or None):
    ops first, then the shuffle's key, sort_by, combiner (the sink) and reducer (the reader)."""
    parts = list(stage.ops) + [p for p in (stage.sink, None if isinstance(stage.input, tuple) else stage.input) if p is not None]
    for part in parts:
        try:
            cloudpickle.dumps(part)
        except Exception:
            fn = _first_unpicklable_callable(part)
            return f"{part.describe()}" + (f" (function {callable_name(fn)})" if fn is not None else ""), fn
    return "the stage's input or sink", None


def _first_unpicklable_callable(obj: Any, depth: int = 0) -> Any:
    import dataclasses

    if depth > 3 or not dataclasses.is_dataclass(obj):
        return None
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        try:
            cloudpickle.dumps(value)
        except Exception:
            if callable(value) and not dataclasses.is_dataclass(value):
                return value
            return _first_unpicklable_callable(value, depth + 1) or (value if callable(value) else None)
    return None
