"""The one model of a run's state that the status page, `zephyr status` and the run record show.

The runner reports each task's life here as it happens (`ObservedBackend` does it for the
backend calls; the runner itself says when the run ends). Reporting is a few dict updates
per task under a lock; nothing is serialized until someone asks for a `snapshot()`, so a run
nobody watches pays almost nothing (measured in `benchmarks/bench_status.py`).

A snapshot is a JSON-ready dict (schema `zephyr-run/1`, described in docs/zephyr.md).
"""

from __future__ import annotations

import itertools
import os
import socket
import threading
import time
import traceback
from collections import Counter, deque
from dataclasses import dataclass, field
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from zephyr.counters import Totals, public
from zephyr.cost import StageCost
from zephyr.dedup.report import dedup_section
from zephyr.errors import ShardError
from zephyr.out_of_memory import is_out_of_memory
from zephyr.status.labels import current_label
from zephyr.status.second_attempts import SecondAttempt

if TYPE_CHECKING:
    from zephyr.plan.compile import Plan, Stage
    from zephyr.tasks import ShardResult, ShardTask

__all__ = ["SCHEMA", "RunState", "RunStatus", "StageState"]

SCHEMA = "zephyr-run/1"
MAX_FAILURES = 100  # failed attempts kept per run (the first ones and the latest ones)
MAX_TRACEBACK = 8000  # characters of a traceback kept (its end: where it failed)
MAX_SAMPLES = 240  # throughput samples kept per stage; older ones are thinned out
STRAGGLERS = 10  # slowest in-flight shards shown per stage
_run_ids = itertools.count(1)


class RunState:
    PENDING = "pending"  # created, not iterated yet: no task has been submitted
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    STOPPED = "stopped"  # the caller stopped iterating before the end
    INTERRUPTED = "interrupted"  # SIGINT/SIGTERM (a KeyboardInterrupt) stopped it; in-flight tasks were cancelled


class StageState:
    WAITING = "waiting"
    RUNNING = "running"
    DONE = "done"
    SKIPPED = "skipped"  # every output of a final skip_existing writer already existed
    FAILED = "failed"
    STOPPED = "stopped"


@dataclass(eq=False)
class _Failure:
    stage: int
    shard: int
    source: str
    attempt: int
    kind: str  # "lost" (worker or node died) or "user_error" (the shard's code or input)
    error_type: str
    message: str
    traceback: str
    at: float
    outcome: str | None = None  # "retried", "fatal", "quarantined", or "abandoned" (the run ended first)
    cause: str = "user"  # zephyr.cost.RETRY_CAUSES: "user", "lost", "storage" (transient) or "memory"
    exc: Any = field(default=None, repr=False)  # until the outcome is known: to recognise the fatal one
    charged: bool = False  # out of memory at the ceiling: the runner charged it to the user's retries

    def to_dict(self) -> dict:
        return {k: v for k, v in self.__dict__.items() if k not in ("exc", "charged")}


@dataclass
class _Stage:
    index: int
    name: str
    ops: list[str]
    description: str
    num_shards: int
    state: str = StageState.WAITING
    started: float | None = None  # monotonic
    ended: float | None = None
    done: int = 0
    resumed: int = 0
    failed: int = 0  # shards given up on (the run failed with them)
    quarantined: int = 0  # shards set aside after failing every attempt (on_shard_failure="quarantine")
    cancelled: int = 0  # shards in flight when the run ended early (their tasks were cancelled)
    lost: int = 0  # attempts lost to dead workers or nodes
    user_errors: int = 0  # attempts that raised
    retried_lost: int = 0
    retried_user: int = 0
    items_in: int = 0
    items_out: int = 0
    bytes_in: int = 0
    bytes_out: int = 0
    counters: Counter = field(default_factory=Totals)  # max/min/average counters fold as in the run
    running: dict = field(default_factory=dict)  # shard -> (submitted monotonic, source, attempt)
    attempts: Counter = field(default_factory=Counter)
    pending_failure: dict = field(default_factory=dict)  # shard -> its last _Failure, until resubmitted
    samples: list = field(default_factory=list)
    sample_every: float = 1.0
    last_sample: float = float("-inf")
    cost: StageCost = field(default_factory=StageCost)  # the runner's, once the stage starts (attach_cost)
    copies: dict = field(default_factory=dict)  # shard -> SecondAttempt: stragglers given a second attempt


class RunStatus:
    """What one `Execution` has done so far; updated by the runner, read by anyone.

    Every method takes the lock, so the status page (another thread) always sees a
    consistent state. `counters` is the execution's own Counter (shared, read-only here).
    """

    def __init__(self, plan: Plan, backend: str, counters: Counter, record_path: str | None = None):
        self.run_id = str(next(_run_ids))
        self.label = current_label()  # what started it (e.g. Marin's executor step), if it said
        self.backend = backend
        self.record_path = record_path
        self.state = RunState.PENDING
        self.error: dict | None = None
        self.started_at = time.time()
        self._t0 = time.monotonic()
        self._ended: float | None = None
        self._counters = counters
        self._stages = [_stage_of(s) for s in plan.stages]
        self._dedups = getattr(plan, "dedups", ())  # where each dedup counts its documents
        # scatter stages whose output a rerun cannot reuse, and why (`Plan.not_resumable`)
        self.not_resumable: list[dict] = plan.not_resumable()
        self._failures: list[_Failure] = []  # the first MAX_FAILURES // 2
        self._recent: deque[_Failure] = deque(maxlen=MAX_FAILURES // 2)
        self._failures_total = 0
        self.crashes: list[dict] = []  # worker processes that crashed during the run (zephyr.status.crashes)
        self.quarantined: list[dict] = []  # zephyr.execution.quarantine: shards set aside, with their errors
        self._outputs: dict[str, dict] = {}  # output path -> {"bytes", "records"} (ShardResult.outputs), for the record
        self._outputs_section: list[dict] | None = None  # the record's `outputs`, once the run has ended
        self._starts: dict[int, Callable[[], set[int] | None]] = {}  # stage -> its shards running now (watch_starts)
        self._lock = threading.Lock()
        self.price_per_core_hour: float | None = None  # turns each stage's CPU seconds into a cost
        self.speculation: str | None = None  # when stragglers get a second attempt (Speculation.describe())

    # ---- reports from the runner -------------------------------------------------------------

    def stage_started(self, index: int, resumed: list[ShardResult], num_shards: int | None = None) -> None:
        """A stage begins; `resumed` are its shards finished by an earlier run (scatter manifests);
        `num_shards`, the tasks it runs when that is not the plan's count (a skewed partition cut
        into key ranges)."""
        with self._lock:
            self.state = RunState.RUNNING
            st = self._stages[index]
            if num_shards is not None:
                st.num_shards = num_shards
            st.state = StageState.RUNNING
            st.started = time.monotonic()
            st.resumed = st.done = len(resumed)
            for result in resumed:
                st.counters.update(result.counters)
            self._sample(st, st.started, force=True)
            if st.done == st.num_shards:  # every shard resumed (or none at all): no task will report it done
                st.state, st.ended = StageState.DONE, st.started

    def stage_inserted(self, plan: Plan, index: int) -> None:
        """The runner added `plan.stages[index]` while the run went (a round: `zephyr.plan.rounds`);
        the stages from there on, none started yet, move one later."""
        with self._lock:
            self._stages.insert(index, _stage_of(plan.stages[index]))
            self._dedups = getattr(plan, "dedups", ())  # a dedup's last stage may have moved
            for st, stage in zip(self._stages[index + 1 :], plan.stages[index + 1 :]):
                st.index, st.name, st.description = stage.index, f"stage {stage.index}", stage.describe()

    def watch_starts(self, index: int, started: Callable[[], set[int] | None]) -> None:
        """How to tell which of stage `index`'s shards in flight are running (the rest wait in
        the backend's queue): `started()` gives their indices, or None when it cannot tell."""
        with self._lock:
            self._starts[index] = started

    def attach_cost(self, index: int, cost: StageCost) -> None:
        """The runner's running totals of stage `index` (`zephyr.cost`), shown from now on."""
        with self._lock:
            self._stages[index].cost = cost

    def shard_submitted(self, index: int, task: ShardTask) -> None:
        with self._lock:
            st = self._stages[index]
            st.attempts[task.shard] += 1
            st.running[task.shard] = (time.monotonic(), task.label, st.attempts[task.shard])
            failure = st.pending_failure.pop(task.shard, None)
            if failure is not None:  # a resubmission: the earlier attempt is retried
                failure.outcome, failure.exc = "retried", None
                if failure.kind == "lost":
                    st.retried_lost += 1
                elif failure.cause != "memory" or failure.charged:  # memory retries: cost.retries["memory"]
                    st.retried_user += 1

    def shard_succeeded(self, index: int, task: ShardTask, result: ShardResult, copy: bool = False) -> None:
        """`copy`: the result is a straggler's second attempt's (the first's is dropped)."""
        with self._lock:
            st = self._stages[index]
            st.running.pop(task.shard, None)
            if task.shard in st.copies:
                st.copies[task.shard].decided(copy)
            st.done += 1
            st.counters.update(result.counters)
            self._outputs.update(getattr(result, "outputs", None) or {})
            c = result.counters
            st.items_in += getattr(result, "items_in", 0)
            st.items_out += _items_out(result)
            st.bytes_in += c.get("zephyr/bytes_read", 0)
            st.bytes_out += c.get("zephyr/bytes_written", 0)
            self._stage_progressed(st)

    def shard_speculated(self, index: int, task: ShardTask, ran: float, threshold: float, node: str | None) -> None:
        """A straggler got a second attempt (`zephyr.execution.speculation`); `node`: where the first runs."""
        with self._lock:
            st = self._stages[index]
            st.attempts[task.shard] += 1
            first = st.running.get(task.shard, (None, None, st.attempts[task.shard] - 1))[2]
            now = time.monotonic()
            st.copies[task.shard] = SecondAttempt(task.shard, task.label, first, st.attempts[task.shard], ran, threshold,
                                                  now - self._t0, now, node)

    def attempt_set_aside(self, index: int, task: ShardTask, error: BaseException, *, lost: bool, copy: bool) -> None:
        """One of a shard's two attempts failed while the other runs on: kept as a failure whose
        outcome is `superseded` (the other decides the shard); nothing is retried for it."""
        with self._lock:
            st = self._stages[index]
            record = st.copies[task.shard]
            attempt = record.copy if copy else record.first
            failure = _failure_of(task, attempt, error, lost)
            failure.outcome = "superseded"
            if lost:
                st.lost += 1
            elif failure.cause != "memory":
                st.user_errors += 1
            record.failed.append(attempt)
            if not copy:  # the second attempt stands for the shard now
                st.running[task.shard] = (record.submitted, task.label, record.copy)
            self._keep(failure)

    def shard_quarantined(self, index: int, entry: dict) -> None:
        """A shard out of attempts was set aside (`zephyr.execution.quarantine`); the stage goes on."""
        with self._lock:
            st = self._stages[index]
            failure = st.pending_failure.pop(entry["shard"], None)
            if failure is not None:
                failure.outcome, failure.exc = "quarantined", None
            st.quarantined += 1
            self.quarantined.append(dict(entry))
            self._stage_progressed(st)

    def processes_crashed(self, crashes: list[dict]) -> None:
        """Worker processes that crashed during the run though its tasks were retried or done."""
        with self._lock:
            self.crashes = [dict(c) for c in crashes]

    def outputs(self) -> dict[str, dict]:
        """The files the run's writers made so far: path -> {"bytes", "records"} (records None: kept, not counted)."""
        with self._lock:
            return dict(self._outputs)

    def outputs_written(self, section: list[dict]) -> None:
        """The run's outputs as its record lists them (`zephyr.status.outputs`): final snapshots carry them."""
        with self._lock:
            self._outputs_section = section

    def shard_failed(self, index: int, task: ShardTask, error: BaseException, *, lost: bool) -> None:
        """An attempt failed; whether it is retried shows when (if) the shard is resubmitted."""
        with self._lock:
            st = self._stages[index]
            started = st.running.pop(task.shard, None)
            attempt = started[2] if started else st.attempts[task.shard]
            failure = _failure_of(task, attempt, error, lost)
            if lost:
                st.lost += 1
            elif failure.cause != "memory":  # out of memory is not the user's error (cost.retries["memory"])
                st.user_errors += 1
            failure.exc = error
            st.pending_failure[task.shard] = failure
            self._keep(failure)

    def charged_to_user(self, index: int, task: ShardTask) -> None:
        """The runner counted the shard's failed attempt against the user's retries: an out-of-memory
        one at its ceiling (not retried with more memory) is then a user error like any other."""
        with self._lock:
            st = self._stages[index]
            failure = st.pending_failure.get(task.shard)
            if failure is not None and failure.cause == "memory" and not failure.charged:
                failure.charged = True
                st.user_errors += 1

    def tasks_cancelled(self, index: int, tasks: list[ShardTask]) -> None:
        with self._lock:
            st = self._stages[index]
            for task in tasks:
                if st.running.pop(task.shard, None) is not None:
                    st.cancelled += 1

    def succeeded(self) -> None:
        """Every shard of the final stage is done (stages never started were skipped)."""
        with self._lock:
            self._end(RunState.SUCCEEDED)

    def ended_early(self, error: BaseException | None) -> None:
        """The run raised `error`, or (None) its caller stopped iterating."""
        with self._lock:
            if self.state not in (RunState.PENDING, RunState.RUNNING):
                return
            if isinstance(error, KeyboardInterrupt):
                self.error = {"type": type(error).__name__, "message": str(error) or "interrupted (KeyboardInterrupt)"}
                self._end(RunState.INTERRUPTED)
                return
            if error is not None:
                self.error = {"type": type(error).__name__, "message": _short(str(error), 4000)}
                self._mark_fatal(error)
            self._end(RunState.FAILED if error is not None else RunState.STOPPED)

    def _mark_fatal(self, error: BaseException) -> None:
        """The attempt whose error the run raised (itself, or as its cause) was given up on."""
        for st in self._stages:
            for shard, failure in list(st.pending_failure.items()):
                if failure.exc is not None and (failure.exc is error or failure.exc is error.__cause__):
                    failure.outcome, failure.exc = "fatal", None
                    st.failed += 1
                    del st.pending_failure[shard]

    def _end(self, state: str) -> None:
        self.state = state
        now = time.monotonic()
        self._ended = now
        for st in self._stages:
            for failure in st.pending_failure.values():
                failure.outcome, failure.exc = "abandoned", None
            st.pending_failure.clear()
            if st.state == StageState.WAITING and state == RunState.SUCCEEDED:
                st.state = StageState.SKIPPED
            elif st.state == StageState.RUNNING:
                st.state = StageState.FAILED if st.failed else StageState.STOPPED
                st.ended = now
                st.cancelled += len(st.running)  # still in flight: never reported cancelled
                st.running.clear()
                self._sample(st, now, force=True)

    # ---- reading -----------------------------------------------------------------------------

    def snapshot(self) -> dict[str, Any]:
        """A JSON-ready copy of the whole state (see the module docstring)."""
        started = self._started_now()  # outside the lock: a backend request (Ray: one to its GCS)
        with self._lock:
            now = time.monotonic()
            stages = [_stage_snapshot(st, now, self._t0, self.price_per_core_hour, started.get(st.index, set()))
                      for st in self._stages]
            failures = self._failures + list(self._recent)  # disjoint: recent fills once the first are kept
            return {
                "schema": SCHEMA,
                "run_id": self.run_id,
                "label": self.label,
                "host": socket.gethostname(),
                "pid": os.getpid(),
                "state": self.state,
                "backend": self.backend,
                "started_at": self.started_at,
                "ended_at": self.started_at + (self._ended - self._t0) if self._ended is not None else None,
                "elapsed_s": round((self._ended if self._ended is not None else now) - self._t0, 3),
                "error": self.error,
                "record_path": self.record_path,
                "stages": stages,
                # a C-level copy under the GIL: the runner only ever adds str keys to it
                "counters": dict(sorted(public(dict(self._counters)).items())),
                "dedups": dedup_section(self._dedups, self._counters),
                "failures": [f.to_dict() for f in failures],
                "failures_total": self._failures_total,
                "not_resumable": [dict(item) for item in self.not_resumable],
                "quarantined": [dict(item) for item in self.quarantined],
                "crashes": [dict(item) for item in self.crashes],
                **({"outputs": list(self._outputs_section)} if self._outputs_section is not None else {}),
                "price_per_core_hour": self.price_per_core_hour,
                "cost": _run_cost(stages),
                "speculation": self.speculation,
            }

    def summary(self) -> dict[str, Any]:
        """One line's worth: id, state, timing, shard totals (for the list of runs)."""
        with self._lock:
            done = sum(st.done for st in self._stages)
            total = sum(st.num_shards for st in self._stages)
            return {"run_id": self.run_id, "label": self.label, "state": self.state, "started_at": self.started_at,
                    "stages": len(self._stages), "shards_done": done, "shards": total,
                    "title": self._stages[-1].description if self._stages else ""}

    def _started_now(self) -> dict[int, set[int] | None]:
        """Per stage with shards in flight, those running now (None: the backend cannot tell)."""
        with self._lock:
            asked = [(i, started) for i, started in self._starts.items() if self._stages[i].running]
        out: dict[int, set[int] | None] = {}
        for index, started in asked:
            try:
                out[index] = started()
            except Exception:  # noqa: BLE001 - e.g. the backend closed meanwhile: the snapshot says unknown
                out[index] = None
        return out

    # ---- helpers (lock held) -----------------------------------------------------------------

    def _stage_progressed(self, st: _Stage) -> None:
        """A shard of `st` finished or was quarantined: the stage is done when no shard is left."""
        now = time.monotonic()
        ended = st.done + st.quarantined == st.num_shards
        if ended:
            st.state, st.ended = StageState.DONE, now
        self._sample(st, now, force=ended)

    def _keep(self, failure: _Failure) -> None:
        self._failures_total += 1
        if len(self._failures) < MAX_FAILURES // 2:
            self._failures.append(failure)
        else:
            self._recent.append(failure)

    def _sample(self, st: _Stage, now: float, force: bool = False) -> None:
        """Append a cumulative point at most every `sample_every` seconds; thin out when full."""
        if not force and now - st.last_sample < st.sample_every:
            return
        st.last_sample = now
        st.samples.append((round(now - self._t0, 3), st.done, st.items_in, st.items_out, st.bytes_in, st.bytes_out))
        if len(st.samples) > MAX_SAMPLES:
            st.samples = st.samples[::2]
            st.sample_every *= 2


def _stage_of(stage: Stage) -> _Stage:
    ops = [stage.input_label] + [o.describe() for o in stage.ops]
    if stage.sink is not None:
        ops.append(stage.sink.describe())
    return _Stage(stage.index, f"stage {stage.index}", ops, stage.describe(), stage.num_shards)


def _run_cost(stages: list[dict]) -> dict[str, Any]:
    """The run's totals of its stages' costs."""
    costs = [st["cost"] for st in stages]
    priced = [c["cost"] for c in costs if c["cost"] is not None]
    return {"cpu_s": round(sum(c["cpu_s"] for c in costs), 3), "peak_rss": max((c["peak_rss"] for c in costs), default=0),
            "cost": round(sum(priced), 6) if priced else None}


def _stage_snapshot(st: _Stage, now: float, t0: float, price: float | None = None,
                    started: set[int] | None = frozenset()) -> dict[str, Any]:
    """`started`: the shards in flight that are running (the rest wait in the backend's queue);
    None when the backend cannot tell, so that `waiting` is unknown (null)."""
    slowest = sorted(st.running.items(), key=lambda kv: kv[1][0])[:STRAGGLERS]
    running = len(st.running) if started is None else sum(1 for shard in st.running if shard in started)
    end = st.ended if st.ended is not None else now
    return {
        "index": st.index,
        "name": st.name,
        "ops": list(st.ops),
        "description": st.description,
        "state": st.state,
        "num_shards": st.num_shards,
        "shards": {
            "done": st.done,
            "running": running,  # started and not finished (all in flight when `waiting` is null)
            "waiting": None if started is None else len(st.running) - running,  # handed to the backend, not started
            "queued": max(0, st.num_shards - st.done - len(st.running) - st.failed - st.quarantined - st.cancelled),
            "cancelled": st.cancelled,
            "resumed": st.resumed,
            "failed": st.failed,
            "lost": st.lost,
            "user_errors": st.user_errors,
            "retried_lost": st.retried_lost,
            "retried_user": st.retried_user,
            "quarantined": st.quarantined,
        },
        "items_in": st.items_in,
        "items_out": st.items_out,
        "bytes_in": st.bytes_in,
        "bytes_out": st.bytes_out,
        "started_s": round(st.started - t0, 3) if st.started is not None else None,
        "elapsed_s": round(end - st.started, 3) if st.started is not None else None,
        "counters": dict(sorted(public(st.counters).items())),
        "cost": st.cost.to_dict(price),
        "throughput": {
            "columns": ["t_s", "shards_done", "items_in", "items_out", "bytes_in", "bytes_out"],
            "samples": [list(s) for s in st.samples] + _live_point(st, now, t0),
        },
        "stragglers": [
            {"shard": shard, "source": source, "attempt": attempt, "elapsed_s": round(now - submitted, 3),
             "waiting": None if started is None else shard not in started,
             "second_attempt": shard in st.copies and st.copies[shard].winner is None}
            for shard, (submitted, source, attempt) in slowest
        ],
        # stragglers given a second attempt, and which attempt won (zephyr.execution.speculation)
        "second_attempts": [copy.to_dict() for _, copy in sorted(st.copies.items())],
    }


def _live_point(st: _Stage, now: float, t0: float) -> list[list]:
    """While a stage runs, its totals now, so the chart reaches the present between samples."""
    if st.state != StageState.RUNNING or not st.samples or now - st.last_sample < 0.05:
        return []
    return [[round(now - t0, 3), st.done, st.items_in, st.items_out, st.bytes_in, st.bytes_out]]


def _items_out(result: ShardResult) -> int:
    """Records a shard wrote (files or shuffle) or handed back to the driver: what its stage hands
    on, so a writer ahead of a stage's shuffle, which the shuffle's records pass through, or
    which skip_existing kept, does not count again."""
    c = result.counters
    if "zephyr/shuffle_records" in c:
        return c["zephyr/shuffle_records"]
    if "zephyr/records_written" in c:
        return c["zephyr/records_written"]
    if c.get("zephyr/shards_skipped_existing"):  # its output was there: this run wrote nothing
        return 0
    return result.num_items


def _failure_of(task: ShardTask, attempt: int, error: BaseException, lost: bool) -> _Failure:
    if isinstance(error, ShardError):
        error_type, message, text = error.error_type, error.error_message, error.traceback_text
    else:
        error_type, message = type(error).__name__, str(error)
        text = "".join(traceback.format_exception(error))
    if lost:
        cause = "storage" if getattr(error, "transient", False) else "lost"
    else:
        cause = "memory" if is_out_of_memory(error) else "user"
    return _Failure(task.stage, task.shard, task.label, attempt, "lost" if lost else "user_error",
                    error_type, _short(message, 2000), text[-MAX_TRACEBACK:], time.time(), cause=cause)


def _short(text: str, limit: int) -> str:
    return text if len(text) <= limit else text[: limit - 15] + " ... (truncated)"
