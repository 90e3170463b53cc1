"""Worker processes that crashed during a run, as one line each (the summary, `zephyr status`,
the warnings): which process, how its end was recorded, and the first line of its crash dump.
A crash is an entry of a snapshot's `crashes` (`zephyr.backends.ray_crashes` finds them on Ray)."""

from __future__ import annotations

from typing import Any

__all__ = ["describe_crash"]


def describe_crash(crash: dict[str, Any]) -> str:
    """One line: which process, how Ray recorded its end, and the first line of its crash dump."""
    what = f"Ray worker pid {crash['pid']} on {crash['host']}" + (f" (task {crash['task']})" if crash.get("task") else "")
    if crash.get("exit"):
        how = f"died: {crash['exit']}: {crash['detail']}; Ray retried any task it was running"
    else:
        how = ("crashed, by the crash dump it logged (Ray recorded no crash: e.g. it crashed while exiting idle, "
               "after its tasks had finished)")
    return f"{what} {how}" + (f"; its log: {crash['log'][0]}" if crash.get("log") else "")
