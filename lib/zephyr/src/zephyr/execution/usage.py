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
from types import FrameType

from zephyr.tasks import TaskUsage

__all__ = ["current", "measuring", "peak_rss", "process_rss", "running"]

_lock = threading.Lock()
_open: dict[int, tuple[int, FrameType]] = {}  # measurements open now: id -> (thread, frame that opened it)
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


def running() -> int:
    """How many tasks of this process are measuring now (their frames still running, see `measuring`)."""
    with _lock:
        _forget_ended(sys._current_frames())
        return len(_open)


def _forget_ended(frames: dict[int, FrameType]) -> None:
    """Drop open measurements whose task has ended without closing them (under `_lock`)."""
    for token, (ident, frame) in list(_open.items()):
        if not _on_stack(frame, frames.get(ident)):
            del _open[token]


def _on_stack(frame: FrameType, top: FrameType | None) -> bool:
    while top is not None:
        if top is frame:
            return True
        top = top.f_back
    return False


class measuring:  # noqa: N801 (used as a function: `with measuring() as m`)
    """Measure the enclosed task; `.usage` of what it yields holds its `TaskUsage` once the
    block has ended (also when it raised).

    Whether another task of the process is running (so the peak is not reset, and the usage is
    marked shared) is told by the measurements still open. A threadpool task may be interrupted
    by an exception raised asynchronously in its thread (`zephyr.execution.interrupts`), a Ray
    task by a cancel's `KeyboardInterrupt`; either can land anywhere in Python code, this class's
    own bookkeeping included, so its exit may never run. An open measurement therefore counts
    only while the frame that opened it is still on its thread's stack (`sys._current_frames`):
    one left open by an interrupted task is forgotten once its task has ended, instead of
    keeping every later task of the process from resetting the peak."""

    def __init__(self) -> None:
        self._measurement = _Measurement()

    def __enter__(self) -> _Measurement:
        global _starts
        frame = sys._getframe(1)
        with _lock:
            if _open:
                _forget_ended(sys._current_frames())
            if not _open:
                _reset_peak()
            self._overlapped = bool(_open)
            _open[id(self)] = (threading.get_ident(), frame)
            _starts += 1
            self._starts = _starts
        self._outer, _current.measurement = current(), self._measurement
        self._rss0 = process_rss()
        self._thread0, self._process0 = time.thread_time(), time.process_time()
        return self._measurement

    def __exit__(self, *exc: object) -> None:
        thread_s, process_s = time.thread_time() - self._thread0, time.process_time() - self._process0
        with _lock:
            _open.pop(id(self), None)
            shared = self._overlapped or _starts != self._starts
        _current.measurement = self._outer
        peak = max(peak_rss(), self._rss0)
        measurement = self._measurement
        measurement.usage = TaskUsage(cpu_s=(thread_s if shared else process_s) + measurement._children_cpu_s,
                                      peak_rss=peak + measurement._children_rss,
                                      rss_rise=max(0, peak - self._rss0) + measurement._children_rss, shared=shared)
