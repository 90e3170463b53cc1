"""The executor's engine: runs a plan of steps once each, concurrently, resumably, across processes.

(User code imports these names from `marin.execution.executor`, the canonical module.)

For every planned step, in dependency order and at most `max_concurrent` at a time:

1. a step whose status file says SUCCESS is skipped; FAILED raises unless
   `force_run_failed` (or waits while another executor holds the step's live lease, which
   may be rerunning it); a step whose dependency failed gets DEP_FAILED and does not run;
2. otherwise the executor takes the step's lease (see `lease`), waiting while another live
   executor holds it, and re-reads the status under the lease (the other may have finished);
3. it writes RUNNING and the info file, calls the function with the resolved config (in a
   thread, or as a Ray task: see `ray_env`), writes SUCCESS or FAILED, and releases the
   lease with the outcome and error (the status file holds only the token).
   A Ray task that died with its node or worker (`NodeDiedError`, `WorkerCrashedError`, ...
   after Ray's own retries; see `marin.tpu.errors.is_preemption`) is recorded PREEMPTED,
   not FAILED: the run still reports the step as failed, but a rerun runs it again without
   `force_run_failed`. A step that lost its lease while running does not write SUCCESS (the
   executor that took it over records the outcome) and fails in this run.

SIGINT or SIGTERM (to a run in the main thread) stops the run at once: no step starts after
it; each running step is interrupted (an exception raised inside its function; a Ray step's
task is cancelled with `ray.cancel`), recorded INTERRUPTED (a rerun runs it again without
`force_run_failed`) and its lease released; a step whose function does not stop within
`interrupt_grace` seconds is recorded and released for it, and its thread left behind (steps
run in daemon threads, see `step_threads`). Steps that never started keep no status. The
experiment record says `interrupted_by` and each step's state, and the run raises
`ExecutorInterrupted` (`executor_main` exits with its `exit_code`: 130 or 143).

An experiment record (`<prefix>/experiments/<script>-<hash>.json`) lists the steps, their
outcome, the git commit, the calling script and the date. When any step fails the run
ends with `ExecutorError`, which names every failed step.
"""

from __future__ import annotations

import logging
import os
import queue
import signal
import sys
import threading
import traceback
from typing import Callable, Iterable

from zephyr.execution.interrupts import handling_signals, signal_name
from zephyr.status.labels import run_label

from marin.execution.hashing import resolve_config
from marin.execution.lease import Lease, default_owner
from marin.execution.planning import Plan, PlannedStep, plan_steps
from marin.execution.ray_env import ray_cancel_grace, run_step_function
from marin.execution.records import ExperimentRecord, step_info
from marin.execution.status import (
    LEASE_DIR,
    STATUS_FILE,
    StepStatus,
    read_info,
    read_status,
    write_info,
    write_status,
)
from marin.execution.step_threads import ExecutorInterrupted, StepInterrupted, StepRun, describe, stop_steps
from marin.execution.steps import ExecutorStep, InputName
from marin.tpu.errors import TpuPreemptedError, is_preemption

__all__ = ["Executor", "ExecutorError", "ExecutorInterrupted", "StepFailedError", "SKIPPED"]

logger = logging.getLogger(__name__)

SKIPPED = "SKIPPED"
_FAILED = (StepStatus.FAILED.value, StepStatus.DEP_FAILED.value)
_DONE = (StepStatus.SUCCESS.value, SKIPPED)


class ExecutorError(RuntimeError):
    """Some steps failed; `failed` maps each failed step's output path to its error."""

    def __init__(self, failed: dict[str, str], dep_failed: list[str], record_path: str | None = None):
        self.failed = failed
        self.dep_failed = dep_failed
        lines = [f"{len(failed)} step(s) failed:"] + [f"  {path}: {error}" for path, error in failed.items()]
        if dep_failed:
            lines.append(f"{len(dep_failed)} dependent step(s) did not run (DEP_FAILED): " + ", ".join(dep_failed))
        if record_path:
            lines.append(f"each step's status and last error: marin steps {record_path}")
        super().__init__("\n".join(lines))


class StepFailedError(RuntimeError):
    """A step failed before (or in another executor) and must not be rerun now; says where."""


def _status(output_path: str) -> str | None:
    status = read_status(output_path)
    return status.value if status is not None else None


class Executor:
    """Runs experiment steps under `prefix`; see the module docstring.

    Args:
        prefix: where output paths go (local directory or URL such as gs://bucket/dir).
        max_concurrent: at most this many steps run (or wait on a lease) at once; None: no
            limit, every ready step starts (as Marin's `max_concurrent=None`).
        force_run_failed: rerun steps whose status is FAILED instead of raising.
        lease_timeout, heartbeat_interval: lease parameters (seconds); others take over a
            step whose holder has not heartbeated for `lease_timeout`.
        poll_interval: seconds between checks while another executor holds a step.
        settle: read-back delay when creating a lease on an object store.
        description: recorded in the experiment record.
        caller: the script recorded in the experiment record (default `sys.argv[0]`).
        executor_info_base_path: where experiment records go (default `<prefix>/experiments`).
        interrupt_grace: after SIGINT/SIGTERM, seconds to wait for interrupted steps to stop
            before recording them INTERRUPTED and leaving their threads behind.
    """

    def __init__(
        self,
        prefix: str,
        *,
        max_concurrent: int | None = 8,
        force_run_failed: bool = False,
        lease_timeout: float = 60.0,
        heartbeat_interval: float = 10.0,
        poll_interval: float = 5.0,
        settle: float = 1.0,
        description: str | None = None,
        caller: str | None = None,
        executor_info_base_path: str | None = None,
        interrupt_grace: float = 10.0,
    ) -> None:
        if not prefix:
            raise ValueError("Executor needs a prefix: pass --prefix or set MARIN_PREFIX, e.g. --prefix /tmp/marin")
        if max_concurrent is not None and max_concurrent < 1:
            raise ValueError(f"max_concurrent must be at least 1, got {max_concurrent}")
        # Checked here, not when a step's lease is made: there it failed inside the step's thread,
        # and the run reported only its dependents ("a dependency failed"), never the bad flag.
        if not 0 < heartbeat_interval < lease_timeout:
            raise ValueError(
                f"lease_timeout must exceed heartbeat_interval, and both be > 0 (defaults 60 and 10 seconds); got "
                f"--lease_timeout {lease_timeout} --heartbeat_interval {heartbeat_interval}"
            )
        if not poll_interval > 0:
            raise ValueError(f"poll_interval must be > 0 seconds, got {poll_interval}")
        self.prefix = _absolute(prefix.rstrip("/"))
        self.max_concurrent = max_concurrent
        self.force_run_failed = force_run_failed
        self.lease_timeout = lease_timeout
        self.heartbeat_interval = heartbeat_interval
        self.poll_interval = poll_interval
        self.settle = settle
        self.description = description
        self.caller = os.path.abspath(caller if caller is not None else (sys.argv[0] or "<interactive>"))
        self.owner = default_owner()
        self.executor_info_base_path = _absolute((executor_info_base_path or f"{self.prefix}/experiments").rstrip("/"))
        if interrupt_grace < 0:
            raise ValueError(f"interrupt_grace must be >= 0 seconds, got {interrupt_grace}")
        self.interrupt_grace = interrupt_grace
        self._stopping = threading.Event()

    def plan(self, steps: Iterable[ExecutorStep | InputName], run_only: list[str] | None = None) -> Plan:
        """Version and order `steps` and their dependencies; reads no storage."""
        return plan_steps(list(steps), self.prefix, run_only)

    # -- dry run -------------------------------------------------------------------------

    def dry_run(
        self, steps: Iterable[ExecutorStep | InputName], run_only: list[str] | None = None, out: Callable[[str], None] = print
    ) -> dict[str, str]:
        """Say per step what a run would do, without running or writing anything.

        Actions: `skip` (succeeded before), `run` (starts at once), `wait` (after
        dependencies that run first, or while another executor holds it), `fail` (failed
        before; needs --force_run_failed), `blocked` (a dependency would fail).
        Returns `{output_path: action}`.
        """
        plan = self.plan(steps, run_only)
        actions: dict[str, str] = {}
        for planned in plan.steps:
            action = self._dry_action(planned, actions)
            actions[planned.output_path] = action
            out(f"{action:<8} {planned.name:<40} {planned.output_path}")
        return actions

    def _dry_action(self, planned: PlannedStep, earlier: dict[str, str]) -> str:
        status = _status(planned.output_path)
        if status == StepStatus.SUCCESS.value:
            return "skip"
        if status == StepStatus.FAILED.value and not self.force_run_failed:
            return "fail"
        deps = [earlier[path] for path in planned.dependencies]
        if any(d in ("fail", "blocked") for d in deps):
            return "blocked"
        if any(d in ("run", "wait") for d in deps):
            return "wait"
        lease = Lease(f"{planned.output_path}/{LEASE_DIR}", timeout=self.lease_timeout, heartbeat_interval=self.heartbeat_interval)
        return "wait" if Lease.is_live(lease.current()) else "run"

    # -- run -----------------------------------------------------------------------------

    def run(self, steps: Iterable[ExecutorStep | InputName], run_only: list[str] | None = None) -> dict[str, str]:
        """Run the plan; returns `{output_path: SUCCESS | SKIPPED}`.

        SIGINT and SIGTERM (when called in the main thread) stop the run: see `_interrupt`.

        Raises:
            ExecutorError: some step failed (its dependents are marked DEP_FAILED).
            ExecutorInterrupted: a signal stopped the run (after recording what it stopped).
        """
        plan = self.plan(steps, run_only)
        record = ExperimentRecord(plan, caller=self.caller, base_path=self.executor_info_base_path, prefix=self.prefix,
                                  description=self.description)
        record.write({})
        states: dict[str, str] = {}
        failed: dict[str, str] = {}
        signals: list[int] = []
        done: queue.SimpleQueue = queue.SimpleQueue()
        self._stopping = threading.Event()

        def on_signal(signum: int) -> None:  # in the main thread, between two bytecodes: no locks
            signals.append(signum)
            done.put(None)

        waiting = list(plan.steps)
        queued: list[PlannedStep] = []
        running: list[StepRun] = []
        limit = self.max_concurrent or max(1, len(plan.steps))
        with handling_signals(on_signal):
            try:
                while (waiting or queued or running) and not signals:
                    queued.extend(self._ready(waiting, states))
                    while queued and len(running) < limit:
                        running.append(StepRun(queued.pop(0)))
                        running[-1].start(lambda run: self._run_step(plan, run), done)
                    if not running:  # nothing runs, so nothing can unblock what still waits
                        if waiting:
                            raise RuntimeError(f"steps never became ready: {[p.name for p in waiting]}")
                        break
                    finished = done.get()
                    if finished is not None:
                        running.remove(finished)
                        self._collect(finished, states, failed)
            except KeyboardInterrupt:  # handlers could not be installed, or another source raised it
                signals.append(signal.SIGINT)
            if signals and (running or queued or waiting):  # a signal after the last step ended stops nothing
                self._interrupt(plan, record, running, states, signals)
        record.write(states)
        if failed:
            dep_failed = [p.output_path for p in plan.steps if states.get(p.output_path) == StepStatus.DEP_FAILED.value]
            raise ExecutorError(failed, dep_failed, record.path)
        return states

    @staticmethod
    def _collect(run: StepRun, states: dict[str, str], failed: dict[str, str]) -> None:
        """Take the outcome of a step whose thread ended into `states` (and `failed`)."""
        state, failure = run.outcome()
        states[run.planned.output_path] = state
        if failure is not None:
            failed[run.planned.output_path] = failure

    def _interrupt(self, plan: Plan, record: ExperimentRecord, running: list[StepRun], states: dict[str, str],
                   signals: list[int]) -> None:
        """Stop after a signal: launch nothing more, interrupt the running steps, wait up to
        `interrupt_grace` seconds for them (a second signal stops waiting), record those that
        still run INTERRUPTED and release their leases, write the experiment record, and raise."""
        signum = signals[0]
        self._stopping.set()
        logger.warning("%s: stopping; interrupting running step(s): %s (up to %.0fs)", signal_name(signum),
                       describe(running), self.interrupt_grace)
        stuck = stop_steps(running, self.interrupt_grace, signals)
        for run in stuck:
            if run.abandon(f"interrupted by {signal_name(signum)}; its function did not stop within "
                           f"{self.interrupt_grace:.0f}s and was left behind"):
                logger.warning("Step %s did not stop within %.0fs; recorded it INTERRUPTED and left it behind",
                               run.name, self.interrupt_grace)
        for run in running:
            if run in stuck:
                states[run.planned.output_path] = StepStatus.INTERRUPTED.value if run.started else "PENDING"
            else:
                self._collect(run, states, {})
        interrupted = [path for path, state in states.items() if state == StepStatus.INTERRUPTED.value]
        not_started = [p.output_path for p in plan.steps if p.output_path not in states or states[p.output_path] == "PENDING"]
        record.write(states, interrupted_by=signal_name(signum))
        raise ExecutorInterrupted(signum, interrupted, not_started)

    def _ready(self, waiting: list[PlannedStep], states: dict[str, str]) -> list[PlannedStep]:
        """Remove and return the steps whose dependencies all succeeded; mark DEP_FAILED ones."""
        ready: list[PlannedStep] = []
        changed = True
        while changed:
            changed = False
            for planned in list(waiting):
                deps = [states.get(path) for path in planned.dependencies]
                if any(d in _FAILED for d in deps):
                    waiting.remove(planned)
                    states[planned.output_path] = StepStatus.DEP_FAILED.value
                    self._mark_dep_failed(planned)
                    changed = True
                elif all(d in _DONE for d in deps):
                    waiting.remove(planned)
                    ready.append(planned)
        return ready

    def _mark_dep_failed(self, planned: PlannedStep) -> None:
        logger.error("Step %s not run: a dependency failed", planned.name)
        if _status(planned.output_path) in (StepStatus.SUCCESS.value, StepStatus.FAILED.value):
            return  # its own FAILED stays: a rerun must not run it again without force_run_failed
        # DEP_FAILED is written without taking the step's lease: never over a live holder's status.
        lease = Lease(f"{planned.output_path}/{LEASE_DIR}", timeout=self.lease_timeout, heartbeat_interval=self.heartbeat_interval)
        if Lease.is_live(lease.current()):
            logger.info("Step %s is held by another executor; not marking it DEP_FAILED", planned.name)
            return
        write_status(planned.output_path, StepStatus.DEP_FAILED)

    def _run_step(self, plan: Plan, run: StepRun) -> str:
        """Skip, wait for, or run one step under its lease; returns SUCCESS or SKIPPED."""
        path = run.planned.output_path
        lease = Lease(f"{path}/{LEASE_DIR}", self.owner, timeout=self.lease_timeout,
                      heartbeat_interval=self.heartbeat_interval, settle=self.settle)
        since = _first_epoch_of_this_run(lease)
        if self._settled(run.planned, lease, _status(path), since, waiting=True):
            return SKIPPED
        if not self._take_lease(run, lease, since):
            return SKIPPED
        outcome: str | None = None
        error: str | None = None
        try:
            # under the lease: the status may come from an executor that held it meanwhile
            if self._settled(run.planned, lease, _status(path), since, waiting=False):
                return SKIPPED
            try:
                self._execute(plan, run)
            except BaseException as e:
                outcome, error = self._record_failure(run, e)
                raise
            outcome = self._record_success(run, lease)
            return outcome
        finally:
            with run.lock:
                if not run.finalized:
                    run.finalized = True
                    lease.release(outcome=outcome, error=error)

    def _take_lease(self, run: StepRun, lease: Lease, since: int) -> bool:
        """Wait until this executor holds the step's lease (True), or another executor's run
        made it succeed meanwhile (False: skip it). Raises StepInterrupted after a signal."""
        planned = run.planned
        announced = False
        while not self._stopping.is_set() and not lease.try_acquire():
            if not announced:
                holder = lease.current() or {}
                logger.info("Step %s is held by %s; waiting", planned.name, holder.get("owner", "another executor"))
                announced = True
            if self._stopping.wait(self.poll_interval):
                raise StepInterrupted()
            if self._settled(planned, lease, _status(planned.output_path), since, waiting=True):
                return False
        if self._stopping.is_set() and lease.epoch is None:  # interrupted before it took the lease
            raise StepInterrupted()
        with run.lock:
            if run.finalized:  # the executor gave up on this step while it took the lease
                lease.release()
                raise StepInterrupted()
            run.lease = lease
        return True

    def _record_success(self, run: StepRun, lease: Lease) -> str:
        """Write SUCCESS, unless the step lost its lease or the executor recorded it INTERRUPTED.

        Whether the lease is still held is read from storage just before writing: `lease.lost`
        alone comes from the heartbeat thread, which may be stalled and not have seen a takeover.
        """
        planned = run.planned
        with run.lock:
            if run.finalized:  # recorded INTERRUPTED by the executor, which stopped waiting for it
                raise StepInterrupted()
            if lease.still_held():
                write_status(planned.output_path, StepStatus.SUCCESS)
                logger.info("Step %s succeeded: %s", planned.name, planned.output_path)
                return StepStatus.SUCCESS.value
        logger.error(
            "Step %s finished after losing its lease; another executor took it over and records its outcome, "
            "so SUCCESS is not written here", planned.name,
        )
        raise StepFailedError(
            f"lost its lease while running (another executor took over {planned.output_path}); SUCCESS not recorded"
        )

    def _settled(self, planned: PlannedStep, lease: Lease, status: str | None, since: int, waiting: bool) -> bool:
        """True when the step needs no run (succeeded); raises when it failed and must not rerun.

        Whether a FAILED status belongs to this run is read from the lease, not inferred from
        epoch numbers: an epoch from `since` on (see `_first_epoch_of_this_run`) that was
        released with outcome FAILED means another executor failed the step while this one
        waited, which always raises. Otherwise the FAILED status is from a previous run: while
        `waiting` and another executor holds a live lease, that holder decides (it may be
        rerunning the step with --force_run_failed, and not have written RUNNING yet), so
        this executor keeps waiting; else it raises unless `force_run_failed`.
        """
        if status == StepStatus.SUCCESS.value:
            logger.info("Step %s already succeeded; skipping: %s", planned.name, planned.output_path)
            _warn_if_made_by_another_version(planned)
            return True
        if status != StepStatus.FAILED.value:
            return False
        where = f"{planned.output_path}/{STATUS_FILE}"
        failed = next(
            (r for r in lease.records_since(since) if r["released"] and r.get("outcome") == StepStatus.FAILED.value), None
        )
        if failed is not None:
            raise StepFailedError(
                f"failed in executor {failed['owner']} (lease epoch {failed['epoch']}) while this one waited "
                f"(see {where} and {lease.directory})"
            )
        if waiting and Lease.is_live(lease.current()):
            return False
        if not self.force_run_failed:
            raise StepFailedError(
                f"failed in a previous run (see {where}; its error is in {lease.directory}); "
                "rerun with --force_run_failed true"
            )
        return False

    def _execute(self, plan: Plan, run: StepRun) -> None:
        planned = run.planned
        step, path = planned.step, planned.output_path
        logger.info("Running step %s -> %s", step.name, path)
        with run.lock:
            if run.finalized:
                raise StepInterrupted()
            run.started = True
            write_status(path, StepStatus.RUNNING)
        config = resolve_config(step.config, plan.output_path, path, plan.prefix)
        write_info(path, step_info(planned, config))
        with run_label(f"executor step {step.name}"):  # the status page names the step its pipelines run for
            run_step_function(step.fn, config, step.name, step.resources, step.pip_dependency_groups, run.interrupter,
                              cancel_grace=ray_cancel_grace(self.interrupt_grace))

    def _record_failure(self, run: StepRun, error: BaseException) -> tuple[str | None, str | None]:
        """Write FAILED (PREEMPTED for a lost node or worker, INTERRUPTED for a signal); returns
        (outcome, error text), or (None, None) when the executor already recorded the step."""
        planned = run.planned
        full = "".join(traceback.format_exception(error))
        text = _capped(full)  # for the lease; the console gets the whole traceback
        name = planned.step.name
        if run.interrupter.interrupted:
            status = StepStatus.INTERRUPTED
            logger.warning("Step %s interrupted (recorded INTERRUPTED; a rerun runs it again)", name)
        elif _is_preemption(error):
            status = StepStatus.PREEMPTED
            logger.error("Step %s lost its node or worker (recorded PREEMPTED; a rerun runs it again): %s: %s",
                         name, type(error).__name__, error)
        else:
            status = StepStatus.FAILED
            # the user's traceback on the console, not only in the lease (`marin steps PREFIX` shows it again)
            logger.error("Step %s failed: %s: %s\n%s", name, type(error).__name__, error, full.rstrip())
        with run.lock:
            if run.finalized:
                return None, None
            write_status(planned.output_path, status)
        return status.value, text


def _absolute(path: str) -> str:
    """A local path made absolute (URLs as they are): the experiment record lists output paths,
    and relative ones meant nothing to `marin steps` run from another directory (every step
    showed NOT STARTED). The versions do not change: the prefix is not part of a step's hash."""
    return path if "://" in path else os.path.abspath(path)


TRACEBACK_CHARS = 4000  # of a failed step's traceback kept in its lease


def _capped(text: str, limit: int = TRACEBACK_CHARS) -> str:
    """`text` within `limit` characters: its start (a chained exception's root cause comes
    first) and its end (where the step raised), with what was cut between them said."""
    if len(text) <= limit:
        return text
    head, tail = limit // 3, limit - limit // 3
    return f"{text[:head]}\n... ({len(text) - head - tail} characters cut) ...\n{text[-tail:]}"


def _warn_if_made_by_another_version(planned: PlannedStep) -> None:
    """A step with `override_output_path` keeps its path when its version changes, so its old
    output is skipped as done: say so, since the user may expect a rerun (Marin skips too)."""
    if not planned.step.override_output_path:
        return
    recorded = (read_info(planned.output_path) or {}).get("hash")
    if recorded is not None and recorded != planned.hash:
        logger.warning(
            "Step %s: %s was made by another version of the step (hash %s, now %s); its "
            "override_output_path keeps the path, so the old output is kept. Remove it (or change "
            "the path) to rerun the step.", planned.name, planned.output_path, recorded, planned.hash,
        )


def _first_epoch_of_this_run(lease: Lease) -> int:
    """The oldest lease epoch whose outcome can belong to this run: the newest epoch when
    its holder has not released it yet (it may still fail while this executor waits), else
    the next one."""
    latest = lease.latest_epoch()
    record = lease.record(latest) if latest else None
    return latest if record is not None and not record["released"] else latest + 1


def _is_preemption(error: BaseException) -> bool:
    """Whether a step's Ray task died with its node or worker rather than raising itself."""
    if "ray" not in sys.modules:  # no Ray in this process: no Ray error either
        return False
    from ray.exceptions import RayTaskError

    # depth 0: the step's own task died (a Ray error inside the step's function is its own bug);
    # a run_on_tpu inside the step that ran out of preemption retries counts too.
    if isinstance(error, TpuPreemptedError) or (
        isinstance(error, RayTaskError) and isinstance(getattr(error, "cause", None), TpuPreemptedError)
    ):
        return True
    return is_preemption(error, max_depth=0)
