"""One stage's tasks on a task pool: a bounded window, retries by cause, results in shard order.

At most `max_parallelism` tasks are in flight. A task whose worker was lost (`TaskLost`) is
resubmitted without charging the user's retry budget; one that hit a transient storage error
likewise, but after a backoff (`zephyr.execution.retry`); a user failure is retried at most
`max_user_retries` times and then ends the stage with the shard's error (other tasks in
flight are cancelled and drained, so none keeps writing after the run has raised), unless the
run quarantines such shards (`zephyr.execution.quarantine`): then the shard is set aside and the
stage goes on without it. A task that ran out of memory is retried with twice its budget up to
the ceiling, without charging the user's budget (`zephyr.execution.memory`, which also sizes
tasks from the first ones' peaks). Results are handed on in shard order, each as soon as every
earlier shard's is (a quarantined shard has none); what each cost is added up in
`StageStats.cost` (`zephyr.cost`). In a stage's tail, a shard running far longer than its
finished peers gets a second attempt (`zephyr.execution.speculation`): the first of the two to
finish is accepted, the other cancelled and dropped, and a failure of one while the other runs
is left to the other (nothing is retried or charged until the shard has one attempt left).
"""

from __future__ import annotations

import dataclasses
import logging
import sys
import time
import traceback
from collections import Counter, deque
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from zephyr.cost import StageCost
from zephyr.errors import ShardError, TaskLost
from zephyr.execution.interrupts import check_interrupted
from zephyr.execution.memory import MemorySizer
from zephyr.execution.pool import TaskPool
from zephyr.execution.quarantine import Quarantine, remove_outputs
from zephyr.execution.retry import BackoffQueue, backoff_delay
from zephyr.execution.shard import run_shard
from zephyr.execution.speculation import Stragglers
from zephyr.out_of_memory import is_out_of_memory
from zephyr.tasks import ShardResult, ShardTask, StageProgram

__all__ = ["INTERRUPT_DRAIN", "StageLoop", "StageStats"]

logger = logging.getLogger("zephyr")

INTERRUPT_DRAIN = 10.0  # seconds an interrupted run waits for its cancelled tasks to end
LOSER_DRAIN = 10.0  # seconds a stage waits at its end for the cancelled losing attempts of its shards
ASK_EVERY = 1.0  # seconds between asking the backend which late attempts have started running


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
    quarantined: int = 0  # shards set aside after failing every attempt (on_shard_failure="quarantine")
    speculated: int = 0  # stragglers given a second attempt (zephyr.execution.speculation)
    won_by_copy: int = 0  # of those, shards whose second attempt finished first
    cost: StageCost = dataclasses.field(default_factory=StageCost)  # CPU, memory, bytes, retries by cause


class StageLoop:
    """Iterate to run `tasks` of one stage on `pool`; yields `ShardResult`s in shard order.

    `finished` holds results already there (map shards an earlier run completed); they are
    handed on in their place without running. `counters` (the run's) gets each result's
    counters once; `progress` is told of each result; `stats` is filled in as it goes.
    With a `quarantine`, a shard out of retries is set aside there instead of ending the stage.
    `sizer` gives each submitted task its memory budget (None: tasks keep theirs, and one
    that runs out of memory is a failure). A pool with an enabled `speculation` policy (and
    `submit_again`) gets second attempts of stragglers; `clock` is what times them (tests pass a fake).
    """

    def __init__(self, pool: TaskPool, program: StageProgram, tasks: list[ShardTask], finished: dict[int, ShardResult],
                 stats: StageStats, counters: Counter, progress: Any, quarantine: Quarantine | None = None,
                 sizer: MemorySizer | None = None, clock: Any = time.monotonic):
        self.pool = pool
        self.index = program.index
        self._program = program
        self.num_shards = len(tasks)
        self.stats = stats
        self.counters = counters
        self.progress = progress
        self._shared = pool.share(program) if len(finished) < len(tasks) else None
        self._finished: dict[int, ShardResult | None] = finished  # None: quarantined
        self._quarantine = quarantine
        self._pending: deque[ShardTask] = deque(t for t in tasks if t.shard not in finished)
        self._in_flight: dict[Any, ShardTask] = {}
        self._backing_off = BackoffQueue()
        self._user_failures: Counter = Counter()
        self._losses: Counter = Counter()
        self._next_shard = 0
        self._start = time.perf_counter()
        self._closed = False
        self._sizer = sizer
        policy = getattr(pool, "speculation", None)
        self._stragglers = Stragglers(policy, len(tasks), len(finished)) if policy is not None and policy.enabled else None
        self._clock = clock
        self._submitted: dict[Any, float] = {}  # handle -> when it was submitted (clock)
        self._started_at: dict[Any, float] = {}  # handle -> when it started running, where the backend says (clock)
        self._asked = float("-inf")  # when the backend was last asked which late attempts run
        self._copies: set = set()  # handles of second attempts
        self._losers: list = []  # cancelled attempts of shards another attempt finished: in the window until they end

    def __iter__(self) -> Iterator[ShardResult]:
        try:
            yield from self._in_order()
            while self._pending or self._in_flight or self._backing_off:
                check_interrupted()  # a Ctrl-C whose exception Python dropped (`interrupts.raise_interrupted`)
                self._submit_ready()
                self._speculate()
                if not self._in_flight:  # only shards backing off after a storage error
                    time.sleep(self._backing_off.seconds_to_next())
                    continue
                for handle in self.pool.wait([*self._in_flight, *self._losers], timeout=self._backing_off.seconds_to_next()):
                    if handle in self._in_flight:
                        self._collect(handle)
                    else:  # a losing attempt ended: its slot is free
                        self._losers.remove(handle)
                yield from self._in_order()
        finally:
            self._stop_in_flight()
            self._drain_losers()
            self._close()

    def _free_slots(self) -> int:
        return self.pool.max_parallelism - len(self._in_flight) - len(self._losers)

    def _submit_ready(self) -> None:
        self._pending.extendleft(reversed(self._backing_off.due()))
        while self._pending and self._free_slots() > 0:
            task = self._pending.popleft()
            if self._sizer is not None:
                task = dataclasses.replace(task, memory=self._sizer.budget(task.shard))
            handle = self.pool.submit(run_shard, self._shared, task)
            self._in_flight[handle] = task
            self._submitted[handle] = self._clock()

    def _collect(self, handle: Any) -> None:
        """Take one finished task's result, or decide what its failure means."""
        task = self._in_flight.pop(handle)
        self._submitted.pop(handle, None)
        self._started_at.pop(handle, None)
        others = self._other_attempts(task.shard)
        try:
            result = self.pool.result(handle)
        except Exception as e:
            if others:
                self._other_decides(task, e)
            elif isinstance(e, TaskLost):
                self._lost(task, e)
            else:
                self._failed(task, e)
            return
        if others:
            self._supersede(task, handle, others)
        self._finished[task.shard] = result
        self.counters.update(result.counters)
        self.stats.items_out += result.num_items
        self.stats.cost.add(result, task.memory)
        if self._sizer is not None:
            self._sizer.observe(result.usage)
        if self._stragglers is not None:
            self._stragglers.finished(result.elapsed)
        self.progress.update(result)

    # ---- stragglers (zephyr.execution.speculation) ---------------------------------------------

    def _speculate(self) -> None:
        """Start a second attempt of each straggler, in free slots of the window (pending shards first)."""
        watch = self._stragglers
        if watch is None or self._pending or self._free_slots() <= 0 or (threshold := watch.threshold()) is None:
            return
        now = self._clock()
        late = {h: (t.shard, self._submitted[h]) for h, t in self._in_flight.items()
                if t.shard not in watch.copied and now - self._submitted[h] > threshold}
        if not late:
            return
        running = self._running(late, now)
        for handle in watch.overdue(now, running)[: self._free_slots()]:
            self._copy(handle, now - running[handle][1], threshold)

    def _running(self, late: dict, now: float) -> dict:
        """`late` (handle -> (shard, submitted)) with each attempt's start where the backend tells
        (Ray: when its task began running; one still waiting for a CPU is left out), asked at
        most every ASK_EVERY seconds; a backend that cannot tell: from submission."""
        since = getattr(self.pool, "running_since", None)
        if since is None:
            return late
        unknown = [h for h in late if h not in self._started_at]
        if unknown and now - self._asked >= ASK_EVERY:
            self._asked = now
            answer = since(unknown)
            wall = time.time()
            for handle in unknown:
                if answer is None:
                    self._started_at[handle] = late[handle][1]
                elif handle in answer:
                    self._started_at[handle] = now - max(0.0, wall - answer[handle])
        return {h: (shard, self._started_at[h]) for h, (shard, _) in late.items() if h in self._started_at}

    def _copy(self, handle: Any, ran: float, threshold: float) -> None:
        task = self._in_flight[handle]
        copy = self.pool.submit_again(run_shard, self._shared, task, handle)
        self._in_flight[copy] = task
        self._submitted[copy] = self._clock()
        self._copies.add(copy)
        self._stragglers.copied.add(task.shard)
        self.stats.speculated += 1
        noted = getattr(self.pool, "speculated", None)  # the status (ObservedBackend)
        if noted is not None:
            noted(task, handle, copy, ran, threshold)
        logger.warning("stage %d shard %d has run %.1fs, past %.1fs (%s); starting a second attempt elsewhere, the first to "
                       "finish wins", self.index, task.shard, ran, threshold, self._stragglers.policy.describe())

    def _other_attempts(self, shard: int) -> list:
        """The handles of the shard's other attempt in flight (none unless it was copied)."""
        if self._stragglers is None or shard not in self._stragglers.copied:
            return []
        return [h for h, t in self._in_flight.items() if t.shard == shard]

    def _supersede(self, task: ShardTask, winner: Any, others: list) -> None:
        """The shard's other attempt lost: cancel it; it holds its slot until it ends."""
        for handle in others:
            self._in_flight.pop(handle)
            self._submitted.pop(handle, None)
            self._started_at.pop(handle, None)
        getattr(self.pool, "supersede", self.pool.cancel)(others)
        self._losers.extend(others)
        if winner in self._copies:
            self.stats.won_by_copy += 1
        logger.info("stage %d shard %d: its %s attempt finished first; the other is cancelled and its result dropped",
                    self.index, task.shard, "second" if winner in self._copies else "first")

    def _other_decides(self, task: ShardTask, error: Exception) -> None:
        """One of the shard's two attempts failed while the other runs: the other decides the
        shard (a failure it repeats is retried or raised then), so nothing is charged now."""
        shown = error if isinstance(error, ShardError) else attribute(error, task)
        logger.warning("stage %d shard %d: one of its two attempts failed (%s: %s); the other goes on", self.index,
                       task.shard, shown.error_type, shown.error_message[:200])

    def _drain_losers(self) -> None:
        """Wait (bounded) for the cancelled losing attempts to end, so that none still writes when
        the stage is over; one blocked where a cancel cannot reach (a call in C) is said and left."""
        if not self._losers:
            return
        self.pool.drain(self._losers, timeout=LOSER_DRAIN)
        ended = set(self.pool.wait(self._losers, timeout=0))
        left = [h for h in self._losers if h not in ended]
        if left:
            logger.warning("stage %d: %d cancelled losing attempt(s) still run %.0fs after the cancel (blocked where it "
                           "cannot reach); left to end on their own: an output one finishes replaces the winner's, "
                           "atomically, with the same content", self.index, len(left), LOSER_DRAIN)
        self._losers = []

    def _lost(self, task: ShardTask, error: TaskLost) -> None:
        """The worker or node died: run the shard again, up to `max_infra_retries` times."""
        self._count_loss(task)
        if self._losses[task.shard] > self.pool.max_infra_retries:
            message = f"was lost {self._losses[task.shard]} times (workers or nodes died)"
            if self._quarantine is not None:  # e.g. a shard that kills its worker every time
                self._set_aside(task, ShardError(self.index, task.shard, task.label, "TaskLost", f"{message}: {error}", ""),
                                self._losses[task.shard])
                return
            raise RuntimeError(f"stage {self.index}, shard {task.shard} (source: {task.label}) {message}; giving up") from error
        self.stats.cost.retried("lost")
        logger.warning("stage %d shard %d lost (%s); resubmitting", self.index, task.shard, error)
        self._pending.appendleft(task)

    def _failed(self, task: ShardTask, raised: Exception) -> None:
        """A failure in the task: storage trouble backs off and retries; the user's retries
        a few times in case the worker was at fault, then ends the stage."""
        error = raised if isinstance(raised, ShardError) else attribute(raised, task)
        if is_out_of_memory(raised) and self._more_memory(task, error):
            return
        if error.transient:  # storage trouble, not the user's: a lost attempt, with backoff
            self._count_loss(task)
            self.counters["zephyr/storage_retries"] += 1
            if self._losses[task.shard] > self.pool.max_infra_retries:
                if self._quarantine is not None:  # e.g. one object the store keeps failing to serve
                    self._set_aside(task, error, self._losses[task.shard])
                    return
                _reraise(error, raised)
            self.stats.cost.retried("storage")
            delay = backoff_delay(self._losses[task.shard], self.pool.retry_backoff)
            logger.warning("stage %d shard %d: transient storage error (%s: %s); retrying in %.1fs",
                           self.index, task.shard, error.error_type, error.error_message[:200], delay)
            self._backing_off.push(task, delay)
            return
        self._user_failures[task.shard] += 1
        charged = getattr(self.pool, "charged_to_user", None)  # the status: out of memory at the ceiling is the user's
        if charged is not None:
            charged(task)
        if self._user_failures[task.shard] > self.pool.max_user_retries:
            if self._quarantine is not None:
                self._set_aside(task, error, self._user_failures[task.shard])
                return
            _reraise(error, raised)
        self.stats.retries_user += 1
        self.stats.cost.retried("user")
        logger.warning("stage %d shard %d failed with %s: %s%s; retrying (%d/%d) in case the worker, not "
                       "the code, was at fault (max_user_retries=0 fails at once)", self.index, task.shard,
                       error.error_type, error.error_message[:200], f" at {error.record}" if error.record else "",
                       self._user_failures[task.shard], self.pool.max_user_retries)
        self._pending.appendleft(task)

    def _set_aside(self, task: ShardTask, error: ShardError, attempts: int) -> None:
        """Quarantine the shard: it is done, with nothing to hand on (and no output on disk)."""
        self._quarantine.add(task, error, attempts)
        remove_outputs(self._program.ops, task, task.input_path if self._program.reader is None else None)
        self.stats.quarantined += 1
        self._finished[task.shard] = None
        if self._stragglers is not None:
            self._stragglers.finished(None)

    def _more_memory(self, task: ShardTask, error: ShardError) -> bool:
        """The task ran out of memory: run it again with twice its budget (not the user's
        failure), unless it had the ceiling already (False: it fails like any other)."""
        if self._sizer is None:
            return False
        budget = self._sizer.grow(task.shard, task.memory)
        if budget is None:
            logger.warning("stage %d shard %d ran out of memory with %s, its ceiling (the memory option, or the node's "
                           "share); failing it", self.index, task.shard, _size(task.memory))
            return False
        self.stats.cost.retried("memory")
        logger.warning("stage %d shard %d ran out of memory (%s: %s) with %s; retrying with %s", self.index, task.shard,
                       error.error_type, error.error_message[:200], _size(task.memory), _size(budget))
        self._pending.appendleft(task)
        return True

    def _count_loss(self, task: ShardTask) -> None:
        """A lost attempt (`stats.retries_lost` counts them; `cost.retries` only those run again)."""
        self._losses[task.shard] += 1
        self.stats.retries_lost += 1

    def _in_order(self) -> Iterator[ShardResult]:
        """The finished results that are next in shard order."""
        while self._next_shard in self._finished:
            self._next_shard += 1
            if self._next_shard == self.num_shards:
                self._close()  # before the last result is handed on
            result = self._finished.pop(self._next_shard - 1)
            if result is not None:
                yield result

    def _stop_in_flight(self) -> None:
        """After a fatal error, an interrupt (SIGINT/SIGTERM) or a caller who stopped iterating."""
        if self._in_flight:
            handles = list(self._in_flight)
            self.pool.cancel(handles)
            interrupted = isinstance(sys.exc_info()[1], KeyboardInterrupt)
            self.pool.drain([*handles, *self._losers], **({"timeout": INTERRUPT_DRAIN} if interrupted else {}))
            self._losers = []

    def _close(self) -> None:
        if not self._closed:
            self._closed = True
            self.stats.elapsed = time.perf_counter() - self._start
            self.progress.close()


def attribute(error: Exception, task: ShardTask) -> ShardError:
    """A failure the shard function did not wrap itself (e.g. the worker ran out of memory).

    A Ray task's error is named by the exception it carries (`cause`): its own text starts with
    the remote traceback, so a message cut to a line's length showed frames and never the error."""
    text = "".join(traceback.format_exception(error))
    cause = getattr(error, "cause", None)
    shown = cause if isinstance(cause, BaseException) else error
    return ShardError(task.stage, task.shard, task.label, type(shown).__name__, str(shown), text)


def _size(memory: int | None) -> str:
    return "no budget" if memory is None else f"{memory / 2**20:,.0f} MiB"


def _reraise(error: ShardError, raised: Exception) -> None:
    if error is raised:
        raise raised
    raise error from raised
