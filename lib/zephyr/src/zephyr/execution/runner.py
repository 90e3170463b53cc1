"""Drives a plan on a backend, stage by stage: the run as a whole.

Per stage, `StageLoop` runs the tasks (bounded window, retries, shard order); around it this
module takes the run's output leases, skips what is already done (every output of a
skip_existing writer current; map shards an earlier run finished, from `ScratchSpace`), hands
each stage's results to the next, and when the run ends, however it ends, removes scratch and
temporaries, releases the leases and writes the run record (`RunReport`). One implementation
for every backend. Counters of failed attempts are dropped, so totals count each shard once.
"""

from __future__ import annotations

import logging
import time
from collections import Counter
from collections.abc import Iterator
from dataclasses import replace
from typing import Any

from zephyr.counters import Totals
from zephyr.execution.checks import stage_program
from zephyr.execution.memory import MemorySizer
from zephyr.execution.observe import ObservedBackend
from zephyr.execution.pool import ExecutionBackend, InlinePool
from zephyr.execution.progress import make_progress
from zephyr.execution.provenance import (outputs_current, recorded_shard_count, refuse_stale_outputs, report_kept, shard_source,
                                         sidecar_path, writer_codes)
from zephyr.execution.quarantine import Quarantine, without_missing
from zephyr.execution.report import RunReport
from zephyr.execution.run_lock import OutputBusyError, RunLocks
from zephyr.execution.scratch import ScratchSpace
from zephyr.execution.stage_loop import StageLoop, StageStats
from zephyr.expr.presence import warn_missing_columns
from zephyr.execution.uncalled_main import note_pipeline_started
from zephyr.status.crashes import describe_crash
from zephyr.io.files import remove_temporaries_for
from zephyr.io.temporaries import sweep_dead_temporaries
from zephyr.plan.compile import Plan, Stage, check_writers, stage_output_paths
from zephyr.plan.ops import WRITE_OPS, written_files
from zephyr.plan.rounds import next_round, unsettled, with_stage_after
from zephyr.shuffle.scatter import ScatterSink
from zephyr.status.record import final_output_dir
from zephyr.tasks import ShardResult, ShardTask, StageProgram

__all__ = ["Execution", "StageStats"]

logger = logging.getLogger("zephyr")


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

    def __init__(self, backend: ExecutionBackend, dataset):
        note_pipeline_started()  # a script's main() did run (zephyr.execution.uncalled_main)
        self.backend = backend
        plan: Plan = dataset if isinstance(dataset, Plan) else dataset.plan()
        self.scratch = ScratchSpace(backend, plan)
        self.scratch_dir = self.scratch.dir
        self.plan = self.scratch.bind(plan)
        self._warn_about_scratch()
        self.programs = [stage_program(stage, backend.requires_pickling) for stage in self.plan.stages]
        self.counters: Counter = Totals()  # sums, or max/min/average where a shard asked for it
        self.stats: list[StageStats] = []
        self.finished = False
        self.elapsed = 0.0
        self._started = time.perf_counter()
        self.report = RunReport(self.plan, backend.describe(), self.counters)
        self.status = self.report.status  # the live state the status page and the run record show
        # shards set aside after failing every attempt (on_shard_failure="quarantine"), else None: fail fast
        quarantining = getattr(backend, "on_shard_failure", "fail") == "quarantine"
        self.quarantine = Quarantine(self.status.shard_quarantined, getattr(backend, "max_quarantined", None)) if quarantining else None
        self.status.price_per_core_hour = getattr(backend, "price_per_core_hour", None)
        speculation = getattr(backend, "speculation", None)  # second attempts of stragglers (execution.speculation)
        self.status.speculation = speculation.describe() if speculation is not None else None
        self._locks = RunLocks(None, [])  # taken when the run starts (_hold_outputs)
        self._results = self._published(self._run())

    @property
    def run_record(self) -> str | None:
        """The path of the `.zephyr-run.json` written when the run ended, if any."""
        return self.report.record

    def __iter__(self) -> Execution:
        return self

    def __next__(self) -> Any:
        return next(self._results)

    def _warn_about_scratch(self) -> None:
        if "://" not in self.scratch_dir and any(isinstance(s.sink, ScatterSink) for s in self.plan.stages):
            if self.backend.spans_machines():
                logger.warning(
                    "zephyr: shuffle scratch %s is a local path but tasks run on several machines; "
                    "reduce tasks elsewhere will not find the map output. Set scratch_dir (or "
                    "ZEPHYR_SCRATCH_DIR, or --scratch-dir) to shared storage such as gs://bucket/scratch",
                    self.scratch_dir,
                )
        for item in self.plan.not_resumable():
            logger.warning("zephyr: stage %d cannot be resumed by a rerun, so its shuffle output is removed when the "
                           "run ends: %s", item["stage"], item["reason"])

    # ---- running -------------------------------------------------------------------------------

    def _run(self) -> Iterator[Any]:
        started = time.perf_counter()
        self._hold_outputs()
        sweep_dead_temporaries()  # what killed runs left in this machine's temp dir
        previous: list[ShardResult] | None = None
        handed: list = []  # the final stage's results, kept only when quarantining
        first = 0
        current = not self.scratch.left_by_earlier_run(self.plan) and self._final_outputs_current()
        if current and len(self.plan.stages) > 1:
            # every output of a skip_existing writer is there: nothing upstream needs to run
            first = len(self.plan.stages) - 1
            self.counters["zephyr/stages_skipped_outputs_exist"] += first
        self._started = started
        index = first
        while index < len(self.plan.stages):  # rounds of a GroupByRounds may add stages as it goes
            stage, program = self.plan.stages[index], self.programs[index]
            index += 1
            tasks = self._tasks(stage, previous)
            previous = None  # the map summaries are in the reduce tasks now; free them
            if len(tasks) != stage.num_shards:  # a skewed partition was cut into key ranges
                stage = self._resize(stage, len(tasks))
            if getattr(stage.input, "may_cut", False) and writer_codes(stage):
                refuse_stale_outputs(self.plan.stages, cut=stage)  # now that its outputs are known
            if self.quarantine:  # its input lacks the quarantined shards: keep its work apart
                stage, tasks = without_missing(stage, tasks, self.quarantine.before(stage.index))
                stage, program = self._replace_stage(stage), replace(program, sink=stage.sink)
            self.scratch.mark(stage)
            final = stage.index == len(self.plan.stages) - 1
            # nothing to run but the existence checks: do them here, starting no workers (or Ray)
            in_process = final and current and _ends_in_skip_writer(stage)
            ordered = self._run_stage(stage, program, tasks, in_process)
            if not final:
                previous = list(ordered)
                _remove_write_temporaries(stage)
                if stage.rounds is not None:
                    self._after_round(stage, previous)
                continue
            for result in ordered:
                if result.shard == stage.num_shards - 1:
                    # every task is done: finish now, so that a caller who stops at the last
                    # item (next(), zip, islice) still gets scratch removed and the summary
                    self._finish()
                if self.quarantine is not None:  # handed over again in the error, which list() would lose
                    handed.extend(result.items or ())
                yield from result.items or ()
        self._finish()
        if self.quarantine:
            error = self.quarantine.error()
            error.results = handed
            raise error

    def _after_round(self, stage: Stage, results: list[ShardResult]) -> None:
        """Round `stage` of a GroupByRounds is done: if its input had not settled, the next round
        goes in after it (`zephyr.plan.rounds`); past the budget the run fails with the op's error."""
        record = stage.rounds.record
        self.counters[f"zephyr/{record.name}_rounds"] = stage.rounds.number
        left = unsettled(stage, results)
        if not left:
            return
        if stage.rounds.number >= record.max_rounds:
            raise record.exhausted(stage.rounds.number, left)
        following = self.scratch.bind_stage(next_round(stage))
        logger.info("zephyr: stage %d (round %d) found %d not settled; round %d follows", stage.index, stage.rounds.number,
                    left, following.rounds.number)
        self.plan = with_stage_after(self.plan, following)
        program = stage_program(following, self.backend.requires_pickling)
        later = [replace(p, index=p.index + 1) for p in self.programs[following.index :]]
        self.programs[following.index :] = [program, *later]
        self.status.stage_inserted(self.plan, following.index)

    def _resize(self, stage: Stage, num_shards: int) -> Stage:
        stage = replace(stage, num_shards=num_shards)
        check_writers(stage)  # a path function may give two of the extra shards one path
        return self._replace_stage(stage)

    def _final_outputs_current(self) -> bool:
        """Every output of the final stage's skip_existing writer is there, made from its input now
        (`_final_outputs_exist`); a final stage that skew cut into more shards than planned is
        judged at the count its outputs record, and then runs at that count."""
        if _final_outputs_exist(self.plan):
            return True
        last = self.plan.stages[-1]
        count = recorded_shard_count(self.plan.stages, last)
        if count is None or not outputs_current(self.plan.stages, replace(last, num_shards=count)):
            return False
        self._replace_stage(replace(last, num_shards=count))
        return True

    def _replace_stage(self, stage: Stage) -> Stage:
        self.plan = replace(self.plan, stages=tuple(stage if s.index == stage.index else s for s in self.plan.stages))
        return stage

    def _finish(self) -> None:
        if self.finished:
            return
        self.finished = True
        _remove_write_temporaries(self.plan.stages[-1])
        if self.quarantine:  # a rerun resumes from the finished map shards: keep their scratch
            self.scratch.remove_unresumable(self.plan)
        else:
            self.scratch.remove(self.plan)
        self.elapsed = time.perf_counter() - self._started
        self._note_crashes()
        if self.quarantine:  # the run fails with QuarantinedShardsError once the results are out: its record now,
            self.report.ended_early(self.quarantine.error())  # so that the summary (on_finish) names it
        else:
            self.report.succeeded()
        report_kept(self.counters)
        warn_missing_columns(self.counters, [record for stage in self.plan.stages for record in stage.ops])
        self._locks.release()
        for callback in self.backend.on_finish:
            callback(self)

    def _note_crashes(self) -> None:
        """Worker processes that crashed during the run, which the backend hid (Ray retries the
        task of a worker that died): into the status, the record and the summary, and said now."""
        crashes = getattr(self.backend, "process_crashes", None)
        if crashes is None or self.status.crashes:
            return
        found = crashes(self.status.started_at)
        for crash in found:
            logger.warning("zephyr: during the run, a %s", describe_crash(crash))
        self.status.processes_crashed(found)

    def _published(self, results: Iterator[Any]) -> Iterator[Any]:
        """`results`, telling the status when the run fails or its caller stops early."""
        try:
            yield from results
        except GeneratorExit:
            self.report.ended_early(None, write=False)
            self.scratch.remove_unresumable(self.plan)
            raise
        except BaseException as e:
            self._note_crashes()
            # the record of a busy output is the other run's
            self.report.ended_early(e, write=not isinstance(e, OutputBusyError))
            self.scratch.remove_unresumable(self.plan)  # a nonce root is this run's alone, busy or not
            raise
        finally:
            self._locks.release()

    def _hold_outputs(self) -> None:
        """Take this run's leases (`zephyr.execution.run_lock`: another run into the same output fails
        fast, one sharing its scratch waits), then refuse to go on when a skip_existing
        writer's directory holds outputs of inputs that are gone (`zephyr.execution.provenance`)."""
        output_dir = final_output_dir(self.plan)
        shared = self.scratch_dir != f"{output_dir}/.zephyr-scratch"
        roots = [s.sink.root for s in self.plan.stages if isinstance(s.sink, ScatterSink)] if shared else []
        self._locks = RunLocks(output_dir, roots)
        self._locks.acquire()
        refuse_stale_outputs(self.plan.stages)

    def _tasks(self, stage: Stage, previous: list[ShardResult] | None) -> list[ShardTask]:
        memory = self.backend.task_resources.memory
        if isinstance(stage.input, tuple):
            split = _split(getattr(self.backend, "intra_shard_workers", 0), stage.num_shards)
            return _with_sources(self.plan.stages, stage, [
                ShardTask(stage.index, i, stage.num_shards, shard.label, shard.items, memory, shard.path, split=split)
                for i, shard in enumerate(stage.input)
            ])
        tasks = stage.input.tasks(stage, previous)  # a list that may carry `largest` (partitions)
        split = _split(getattr(self.backend, "intra_shard_workers", 0), len(tasks))
        for i, task in enumerate(tasks):
            tasks[i] = replace(task, memory=memory, split=split)
        return _with_sources(self.plan.stages, stage, tasks)

    def _run_stage(self, stage: Stage, program: StageProgram, tasks: list[ShardTask],
                   in_process: bool = False) -> Iterator[ShardResult]:
        stats = StageStats(stage.index, stage.describe(), stage.num_shards)
        stats.largest_partitions = list(getattr(tasks, "largest", ()))
        self.stats.append(stats)
        progress = make_progress(self.backend.progress, stage, stats.largest_partitions)
        finished = self.scratch.completed_maps(stage)
        if finished:
            self.counters["zephyr/map_shards_resumed"] += len(finished)
            stats.resumed = len(finished)
            for result in finished.values():
                self.counters.update(result.counters)
                progress.update(result)
        pool = ObservedBackend(InlinePool() if in_process else self.backend, self.status, stage.index, list(finished.values()),
                               stage.num_shards)
        self.status.attach_cost(stage.index, stats.cost)
        return iter(StageLoop(pool, program, tasks, finished, stats, self.counters, progress, self.quarantine, self._sizer(in_process)))

    def _sizer(self, in_process: bool) -> MemorySizer | None:
        """Each stage's task budgets (`zephyr.execution.memory`); none for existence checks."""
        ceiling = getattr(self.backend, "memory_ceiling", None)
        if in_process or ceiling is None:
            return None
        return MemorySizer(self.backend.task_resources.memory, ceiling)


def _split(workers: int, shards: int) -> int:
    """Processes each shard's per-item ops may use: the workers a stage of fewer shards would
    leave idle (`zephyr.execution.intra_shard`); 1 (no split) when intra-shard execution is off."""
    return max(1, workers // shards) if workers > 1 and 0 < shards < workers else 1


def _remove_write_temporaries(stage: Stage) -> None:
    """Once a stage's outputs are all written, temporaries of earlier or killed attempts of
    those outputs, and of a skip_existing writer's sidecars, are litter: remove them with one
    listing per output directory."""
    paths = [written for record in stage.ops if isinstance(record, WRITE_OPS)
             for path in stage_output_paths(stage, record)
             for written in [*written_files(record, path), *([sidecar_path(path)] if record.skip_existing else [])]]
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


