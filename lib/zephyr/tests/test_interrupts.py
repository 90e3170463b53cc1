"""`zephyr.execution.interrupts.ThreadInterrupter`: an interrupt lands inside the call and only there.

The end-to-end behaviour (signals to the `zephyr` command and to `executor_main`) is tested in
test_cli_interrupt.py and lib/marin/tests/test_executor_interrupt.py; these pin the contract
those rely on, in one process, with real threads.
"""

from __future__ import annotations

import subprocess
import sys
import threading

import pytest

from zephyr.execution.interrupts import Interrupted, ThreadInterrupter


class Stop(Interrupted):
    pass


def run_in_thread(fn) -> dict:
    outcome: dict = {}

    def body():
        try:
            outcome["value"] = fn()
        except BaseException as e:  # noqa: BLE001 - what the call raised is the result
            outcome["error"] = e

    thread = threading.Thread(target=body, daemon=True)
    thread.start()
    outcome["thread"] = thread
    return outcome


def test_interrupt_lands_in_a_python_loop_of_another_thread():
    interrupter = ThreadInterrupter(Stop)
    entered = threading.Event()

    def loop():
        entered.set()
        while True:  # pure Python: the exception lands at the next bytecode
            threading.Event().wait(0.01)

    outcome = run_in_thread(lambda: interrupter.call(loop))
    assert entered.wait(60)
    assert interrupter.interrupt() is True
    outcome["thread"].join(60)
    assert not outcome["thread"].is_alive() and isinstance(outcome["error"], Stop)


def test_a_call_that_swallows_the_interrupt_still_raises_it():
    interrupter = ThreadInterrupter(Stop)
    entered = threading.Event()

    def swallow():
        entered.set()
        try:
            while True:
                threading.Event().wait(0.01)
        except Stop:
            return "pretended to finish"

    outcome = run_in_thread(lambda: interrupter.call(swallow))
    assert entered.wait(60)
    interrupter.interrupt()
    outcome["thread"].join(60)
    assert "value" not in outcome and isinstance(outcome["error"], Stop)


def test_interrupted_before_the_call_it_never_runs():
    interrupter = ThreadInterrupter(Stop)
    assert interrupter.interrupt() is False  # nothing running yet: no exception sent
    ran = []
    with pytest.raises(Stop):
        interrupter.call(ran.append, 1)
    assert ran == []


def test_an_interrupt_after_the_call_returned_does_not_land_in_the_callers_code():
    interrupter = ThreadInterrupter(Stop)
    assert interrupter.call(lambda: 42) == 42
    interrupter.interrupt()  # the call has returned: nothing may be raised into this thread now
    total = sum(range(100_000))  # many bytecodes, where a stray async exception would land
    assert total == 4999950000


EXITING_LATE = """
import sys, threading, time
from zephyr.execution.interrupts import exit_after

exit_after(0.5, 7, from_shutdown=sys.argv[1] == "shutdown")
threading.Thread(target=time.sleep, args=(600,)).start()  # non-daemon: the interpreter's shutdown waits for it
time.sleep(3)  # a caller going on after the interrupt (a notebook, a test run)
print("still running", flush=True)
"""


@pytest.mark.parametrize("start", ["now", "shutdown"])
def test_exit_after_ends_a_process_stuck_in_shutdown_and_counts_from_it_when_asked(tmp_path, start):
    """`exit_after` ends a process whose shutdown waits on a thread that never ends (exit 7 after
    0.5 s); with `from_shutdown` the 0.5 s count from the shutdown, so a process that goes on
    meanwhile (3 s here) is not ended under it."""
    script = tmp_path / "late.py"
    script.write_text(EXITING_LATE)
    done = subprocess.run([sys.executable, str(script), start], capture_output=True, text=True, timeout=120)
    assert done.returncode == 7, done.stderr[-2000:]
    assert ("still running" in done.stdout) == (start == "shutdown"), done.stdout
