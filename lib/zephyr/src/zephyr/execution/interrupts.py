"""Stopping promptly on SIGINT/SIGTERM: signal handlers for a run, and interrupts for worker threads.

Python turns SIGINT into a `KeyboardInterrupt` in the main thread only, and SIGTERM kills the
process without running any `finally` (temporaries stay, leases stay held). A run that must
stop honestly needs both signals turned into an exception (or a flag) in the main thread, and
work running in other threads stopped too. A thread cannot be killed from outside; what can be
done is to raise an exception in it asynchronously (`PyThreadState_SetAsyncExc`), which lands
at its next Python bytecode: a loop in Python code stops within an iteration, while a call
blocked in C (a long `time.sleep`, a socket read) stops only when that call returns. So callers
wait a short grace period and then leave such a thread behind (and never record its work as
done).

- `Interrupted`: the exception a signal becomes (a `KeyboardInterrupt`, so `except Exception`
  does not swallow it); `exit_code` is the shell's convention, 128 + signal number.
- `handling_signals(handler)`: SIGINT and SIGTERM call `handler(signum)` while the block runs
  (main thread only; elsewhere it does nothing), then the previous handlers come back.
- `raise_interrupted(signum)`: such a handler, whose interrupt sticks: a run's wait loop raises
  it again (`check_interrupted`) if it landed where Python drops exceptions (a gc callback).
- `ThreadInterrupter`: runs a call in the current thread so that another thread can interrupt
  it; the interrupt can land only inside that call, never in the caller's bookkeeping around it.
- `exit_after(seconds, code)`: once a run has stopped, a thread left behind (or one that a
  thread pool joins at exit) must not keep the process alive: exit hard after `seconds` (counted
  from the interpreter's shutdown with `from_shutdown`, for a caller that may go on).
- `WAIT_SLICE`: blocking waits in a thread that may be interrupted wake at least this often,
  because an asynchronous exception cannot land while a thread is blocked in C.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

__all__ = ["WAIT_SLICE", "Cancelled", "Interrupted", "ThreadInterrupter", "check_interrupted", "clear_interrupted", "exit_after",
           "handling_signals", "raise_interrupted", "signal_name", "wait_slice"]

SIGNALS = (signal.SIGINT, signal.SIGTERM)
WAIT_SLICE = 0.5  # seconds


def wait_slice(timeout: float | None) -> float:
    """`timeout` for one blocking wait, at most WAIT_SLICE (a caller loops until its own deadline)."""
    return WAIT_SLICE if timeout is None else min(timeout, WAIT_SLICE)


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


class Interrupted(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM); `exit_code` is 128 + its number."""

    signum: int = signal.SIGINT

    def __init__(self, signum: int | None = None, message: str | None = None):
        if signum is not None:
            self.signum = int(signum)
        super().__init__(message or f"interrupted by {signal_name(self.signum)}")

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


_undelivered: list[int] = []  # signals `raise_interrupted` raised that may not have reached a run


class Cancelled(Interrupted):
    """Raised inside a shard the run cancelled (another shard failed, or the run was interrupted):
    says so, where a bare `Interrupted` would read "interrupted by SIGINT"."""

    def __init__(self, signum: int | None = None, message: str | None = None):
        super().__init__(signum, message or "cancelled: the run is stopping")


def raise_interrupted(signum: int) -> None:
    """A `handling_signals` handler: raise `Interrupted(signum)` where the main thread is.

    Python runs a signal handler at whatever bytecode the main thread is at; if that is inside a
    garbage-collector callback or a `__del__`, the exception is printed ("Exception ignored
    in ...") and dropped, and the run goes on. So the signal is also noted, and a run's wait
    loop calls `check_interrupted()`, which raises it again; `clear_interrupted()` once handled.
    """
    _undelivered.append(signum)
    raise Interrupted(signum)


def check_interrupted() -> None:
    """Raise `Interrupted` for a signal `raise_interrupted` raised that no one has handled
    (`clear_interrupted`): one dropped where it landed, or caught and ignored."""
    if _undelivered:
        raise Interrupted(_undelivered[0])


def clear_interrupted() -> None:
    """The interrupt was handled (the run stopped): later runs in this process are not stopped by it."""
    _undelivered.clear()


@contextlib.contextmanager
def handling_signals(handler: Callable[[int], Any]) -> Iterator[bool]:
    """While the block runs, SIGINT and SIGTERM call `handler(signum)` in the main thread.

    Yields whether the handlers were installed (only the main thread can install them).
    The previous handlers are restored afterwards, whatever they were.
    """
    if threading.current_thread() is not threading.main_thread():
        yield False
        return
    previous = {sig: signal.getsignal(sig) for sig in SIGNALS}
    for sig in SIGNALS:
        signal.signal(sig, lambda signum, frame: handler(signum))
    try:
        yield True
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old if old is not None else signal.SIG_DFL)


def _set_async_exc(thread_id: int, exc_type: type[BaseException] | None) -> bool:
    """Raise `exc_type` in thread `thread_id` at its next bytecode (None: cancel a pending one)."""
    setter = getattr(getattr(ctypes, "pythonapi", None), "PyThreadState_SetAsyncExc", None)
    if setter is None:  # not CPython: callers fall back to waiting for the thread
        return False
    exc = ctypes.py_object(exc_type) if exc_type is not None else None
    return setter(ctypes.c_ulong(thread_id), exc) == 1


class ThreadInterrupter:
    """Run one call so that another thread may interrupt it with `exc_type`.

    `call(fn, *args)` runs `fn` in the calling thread; `interrupt()` (from any thread) raises
    `exc_type` inside that call at its next bytecode, or makes a call that has not started
    raise it at once. After `interrupt()`, `call` raises `exc_type` even when `fn` swallowed the
    exception and returned: work that was interrupted is never taken for finished.
    """

    def __init__(self, exc_type: type[BaseException] = Interrupted):
        self.exc_type = exc_type
        self.interrupted = False
        self._lock = threading.Lock()
        self._thread_id: int | None = None

    def call(self, fn: Callable[..., Any], *args: Any) -> Any:
        with self._lock:
            if self.interrupted:
                raise self.exc_type()
            self._thread_id = threading.get_ident()
        try:
            result = fn(*args)
        finally:
            with self._lock:
                self._thread_id = None
                _set_async_exc(threading.get_ident(), None)  # one that has not landed yet: drop it
        if self.interrupted:
            raise self.exc_type()
        return result

    def interrupt(self) -> bool:
        """Interrupt the call (once); True when an exception was sent into a running call."""
        with self._lock:
            if self.interrupted:
                return False
            self.interrupted = True
            return self._thread_id is not None and _set_async_exc(self._thread_id, self.exc_type)


def exit_after(seconds: float, code: int, *, from_shutdown: bool = False) -> threading.Thread:
    """Exit the process with `code` after `seconds`, unless it has exited by then.

    For a process that stopped on a signal but may not manage to exit: interpreter shutdown
    joins every non-daemon thread (thread pools' workers included), and a thread blocked in C
    never ends. The timer is a daemon thread, so a process that exits normally is not delayed.

    With `from_shutdown`, the `seconds` count from when the interpreter starts to shut down (the
    main thread has ended), not from now: for a library call (`executor_main`) whose SystemExit
    a long-lived caller may catch and go on (a notebook, a test run), which must not be ended
    later by a timer it never knew of.
    """

    def expire() -> None:
        if from_shutdown:
            threading.main_thread().join()  # returns once the interpreter is shutting down
        time.sleep(seconds)
        logging.getLogger("zephyr").error(
            "still not exited %.0fs after the interrupt (a thread is blocked); exiting now with status %d", seconds, code)
        for stream in (sys.stdout, sys.stderr):
            with contextlib.suppress(Exception):
                stream.flush()
        os._exit(code)

    timer = threading.Thread(target=expire, name="zephyr-exit-after-interrupt", daemon=True)
    timer.start()
    return timer
