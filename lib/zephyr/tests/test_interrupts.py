"""`zephyr.execution.interrupts.ThreadInterrupter`: an interrupt lands inside the call and only there.

The end-to-end behaviour (signals to the `zephyr` command and to `executor_main`) is tested in
test_cli_interrupt.py and lib/marin/tests/test_executor_interrupt.py; these pin the contract
those rely on, in one process, with real threads.
"""

from __future__ import annotations

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
