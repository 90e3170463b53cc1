"""The runs of this process, newest last: what a status page served by this process shows.

Every `Execution` publishes its `RunStatus` here when it is created. Only the latest
`MAX_RUNS` are kept, so a long-lived driver that runs many pipelines does not grow.
"""

from __future__ import annotations

import threading
from collections import deque

from zephyr.status.model import RunState, RunStatus

__all__ = ["MAX_RUNS", "find", "latest", "publish", "runs"]

MAX_RUNS = 64
_runs: deque[RunStatus] = deque(maxlen=MAX_RUNS)
_lock = threading.Lock()


def publish(status: RunStatus) -> None:
    with _lock:
        _runs.append(status)


def runs() -> list[RunStatus]:
    with _lock:
        return list(_runs)


def find(run_id: str) -> RunStatus | None:
    return next((r for r in runs() if r.run_id == run_id), None)


def latest() -> RunStatus | None:
    """The newest run still running, else the newest run (None before the first).

    A run that was created but never iterated ("pending") is not preferred: it may never start.
    """
    all_runs = runs()
    running = [r for r in all_runs if r.state == RunState.RUNNING]
    return (running or all_runs or [None])[-1]
