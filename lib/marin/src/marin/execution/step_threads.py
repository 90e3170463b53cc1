"""Each running step in its own daemon thread, so that an interrupted executor can stop it and leave.

A step's function runs in the executor's process (or waits there for its Ray task). When the
executor is interrupted (SIGINT/SIGTERM), `stop_steps` interrupts every running step: an
exception raised inside its function (see `zephyr.execution.interrupts.ThreadInterrupter`; a Ray step
turns it into `ray.cancel` of its task, see `ray_env`), then waits a grace period for the threads
to record the step INTERRUPTED and release its lease. A thread that is still busy after that
(its function is blocked in C) is left behind: `abandon` records the step INTERRUPTED and
releases the lease for it, and its late outcome is never recorded. The threads are daemons, so
such a thread does not keep the process alive once the executor has exited.

Whoever finalizes a step first (its thread, or `abandon`) writes its last status and releases
its lease, under the step's lock; the other does nothing.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from zephyr.execution.interrupts import Interrupted, ThreadInterrupter, signal_name

from marin.execution.lease import Lease
from marin.execution.planning import PlannedStep
from marin.execution.status import StepStatus, write_status

__all__ = ["ExecutorInterrupted", "StepInterrupted", "StepRun", "describe", "stop_steps"]

logger = logging.getLogger(__name__)


class ExecutorInterrupted(Interrupted):
    """SIGINT or SIGTERM stopped the run. `interrupted`: output paths of the steps it stopped
    (recorded INTERRUPTED); `not_started`: those it never started (no status written).
    `exit_code` is 128 + the signal's number (130 for SIGINT, 143 for SIGTERM)."""

    def __init__(self, signum: int, interrupted: list[str], not_started: list[str]):
        self.interrupted = interrupted
        self.not_started = not_started
        super().__init__(
            signum,
            f"interrupted by {signal_name(signum)}: {len(interrupted)} step(s) stopped and recorded INTERRUPTED, "
            f"{len(not_started)} not started; rerun the same command to continue",
        )


class StepInterrupted(Interrupted):
    """Raised inside a step's function (or its wait for a lease) when the executor is interrupted."""


class StepRun:
    """One step being run by the executor: its thread, its interrupter, its lease once held."""

    def __init__(self, planned: PlannedStep):
        self.planned = planned
        self.interrupter = ThreadInterrupter(StepInterrupted)
        self.lock = threading.Lock()
        self.lease: Lease | None = None
        self.started = False  # its function was called (RUNNING written)
        self.finalized = False  # last status written and lease released (by its thread or by `abandon`)
        self.result: str | None = None
        self.error: BaseException | None = None
        self.thread: threading.Thread | None = None

    @property
    def name(self) -> str:
        return self.planned.name

    def start(self, target: Callable[[StepRun], str], done: queue.SimpleQueue) -> None:
        """Run `target(self)` in a daemon thread; `done` receives this run when it ends."""

        def body() -> None:
            try:
                self.result = target(self)
            except BaseException as e:  # noqa: BLE001 - handed to the executor's loop
                self.error = e
            finally:
                done.put(self)

        self.thread = threading.Thread(target=body, name=f"marin-step:{self.name}", daemon=True)
        self.thread.start()

    def alive(self) -> bool:
        return self.thread is not None and self.thread.is_alive()

    def outcome(self) -> tuple[str, str | None]:
        """(state for the experiment record, failure text or None) once its thread has ended."""
        if self.error is None:
            return self.result or StepStatus.SUCCESS.value, None
        if self.interrupter.interrupted:
            return (StepStatus.INTERRUPTED.value if self.started else "PENDING"), None
        return StepStatus.FAILED.value, f"{self.name}: {type(self.error).__name__}: {self.error}"

    def abandon(self, reason: str) -> bool:
        """Record the step INTERRUPTED and release its lease, unless its thread already did.

        Returns True when this call finalized it."""
        with self.lock:
            if self.finalized:
                return False
            self.finalized = True
            lease = self.lease
            if lease is None:
                return True
            outcome = None
            if self.started:
                write_status(self.planned.output_path, StepStatus.INTERRUPTED)
                outcome = StepStatus.INTERRUPTED.value
            lease.release(outcome=outcome, error=reason if outcome else None)
            return True


def stop_steps(runs: list[StepRun], grace: float, signals: list[int]) -> list[StepRun]:
    """Interrupt `runs` and wait up to `grace` seconds for their threads to end (a further
    signal cuts the wait short); returns the runs whose threads are still busy."""
    for run in runs:
        run.interrupter.interrupt()
    seen = len(signals)
    deadline = time.monotonic() + grace
    while any(run.alive() for run in runs) and time.monotonic() < deadline and len(signals) == seen:
        time.sleep(0.05)
    return [run for run in runs if run.alive()]


def describe(runs: list[StepRun]) -> str:
    return ", ".join(run.name for run in runs) or "none"
