"""Measure what a shard task used: CPU seconds and the peak resident set, in its worker.

A Ray worker runs one task at a time, so the process's figures are the task's: its CPU time
(`time.process_time`, user+system of every thread) and its resident-set high-water mark,
reset when the task starts (Linux: writing 5 to `/proc/self/clear_refs` resets `VmHWM`; else
`ru_maxrss`, which never goes down, so a task after a bigger one reports the bigger peak).
Threadpool tasks share the driver's process: while several overlap, CPU is the task's own
thread (`time.thread_time`: work a library does on its own threads is missed) and the peak is
the process's during the task, marked `shared`. The high-water mark is reset only when no
other task of this process is running, so one task's reset never hides another's peak.

Processes a task hands its work to (intra-shard chunk processes, `zephyr.execution.intra_shard`)
are the task's too: their CPU seconds are added to its own, and the sum of their peaks to its
peak and rise. A sum, not a max: they run at the same time as the task and each other, and the
peak sizes the task's memory budget (`zephyr.execution.memory`), which has to hold them all.
"""

from __future__ import annotations

import contextlib
import os
import resource
import sys
import threading
import time
from collections.abc import Iterator

from zephyr.tasks import TaskUsage

__all__ = ["current", "measuring", "peak_rss", "process_rss"]

_lock = threading.Lock()
_active = 0  # tasks of this process measuring now
_starts = 0  # tasks of this process started so far (to tell whether another overlapped)
_current = threading.local()  # .measurement: the task measuring in this thread
_STATUS = "/proc/self/status"
_CLEAR_REFS = "/proc/self/clear_refs"


def _status_kib(field: str) -> int | None:
    try:
        with open(_STATUS, "rb") as f:
            for line in f:
                if line.startswith(field.encode()):
                    return int(line.split()[1])
    except (OSError, ValueError, IndexError):
        pass
    return None


_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096


def process_rss() -> int:
    """This process's resident set now, in bytes (0 where /proc is missing). `statm`: one
    short line, several times cheaper to read than `status`."""
    try:
        with open("/proc/self/statm", "rb") as f:
            return int(f.read().split()[1]) * _PAGE
    except (OSError, ValueError, IndexError):
        return 0


def peak_rss() -> int:
    """This process's resident-set high-water mark, in bytes (since the last reset, see the module doc)."""
    kib = _status_kib("VmHWM:")
    if kib is not None:
        return kib * 1024
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return peak if sys.platform == "darwin" else peak * 1024


def _reset_peak() -> None:
    with contextlib.suppress(OSError):
        with open(_CLEAR_REFS, "w") as f:
            f.write("5")


class _Measurement:
    usage: TaskUsage | None = None

    def __init__(self) -> None:
        self._children_cpu_s = 0.0
        self._children_rss = 0

    def add_children(self, cpu_s: float, peak_rss: int) -> None:
        """Processes that ran the task's work: their CPU seconds and the sum of their peaks
        (see the module doc). Too late once the task has ended: its usage is reported."""
        self._children_cpu_s += cpu_s
        self._children_rss += peak_rss


def current() -> _Measurement | None:
    """The measurement of the task running in this thread (None outside one), for work it
    hands to other processes."""
    return getattr(_current, "measurement", None)


@contextlib.contextmanager
def measuring() -> Iterator[_Measurement]:
    """Measure the enclosed task; `.usage` holds its `TaskUsage` once the block has ended
    (also when it raised).

    The count of tasks measuring (`_active`) must come back down however the task ends: a
    threadpool task may be interrupted by an exception raised asynchronously in its thread
    (`zephyr.execution.interrupts`), which lands at a call or a loop's jump. So the count goes
    up and is marked counted with no call between, and comes down first thing in the outermost
    `finally`; a leaked count would keep later tasks from resetting the peak (and mark them
    shared) for the rest of the process."""
    global _active, _starts
    counted = False
    try:
        with _lock:
            if _active == 0:
                _reset_peak()
            overlapped = _active > 0
            _active += 1
            counted = True
            _starts += 1
            starts = _starts
        measurement = _Measurement()
        outer, _current.measurement = current(), measurement
        rss0 = process_rss()
        thread0, process0 = time.thread_time(), time.process_time()
        try:
            yield measurement
        finally:
            thread_s, process_s = time.thread_time() - thread0, time.process_time() - process0
            _current.measurement = outer
            peak = max(peak_rss(), rss0)
            shared = overlapped or _starts != starts
            children_cpu_s, children_rss = measurement._children_cpu_s, measurement._children_rss
            measurement.usage = TaskUsage(cpu_s=(thread_s if shared else process_s) + children_cpu_s,
                                          peak_rss=peak + children_rss, rss_rise=max(0, peak - rss0) + children_rss,
                                          shared=shared)
    finally:
        if counted:
            with _lock:
                _active -= 1
