"""What a run tells others: its live state for the status page, and its record when it ends.

Every run publishes a `RunStatus` (`zephyr.status`) when it is created; when it ends, however
it ends, the final snapshot is written beside its outputs as `.zephyr-run.json`, which
`zephyr status DIR` and the dashboard read, with the files the run wrote (`outputs`: each one's
size and record count), which `zephyr verify DIR` checks.
"""

from __future__ import annotations

from collections import Counter

from zephyr.status import registry as status_registry
from zephyr.status.model import RunState, RunStatus
from zephyr.status.outputs import outputs_section
from zephyr.status.record import read_run_record, record_path_for, write_run_record

__all__ = ["RunReport"]


class RunReport:
    """The run's `status` (live, published) and `record` (the written record's path, if any)."""

    def __init__(self, plan, backend_description: str, counters: Counter):
        self.status = RunStatus(plan, backend_description, counters, record_path_for(plan))
        self.record: str | None = None
        status_registry.publish(self.status)

    def succeeded(self) -> None:
        self._list_outputs()
        self.status.succeeded()
        self.write_record()

    def ended_early(self, error: BaseException | None, write: bool = True) -> None:
        """The run failed (`error`) or its caller stopped iterating (None)."""
        if self.status.state not in (RunState.PENDING, RunState.RUNNING):  # its end is reported and recorded already
            return
        self._list_outputs()
        self.status.ended_early(error)
        if write:
            self.write_record()

    def write_record(self) -> None:
        """The final snapshot beside the outputs (`.zephyr-run.json`), for `zephyr status DIR`."""
        path = self.status.record_path
        if path is not None and write_run_record(self.status.snapshot(), path):
            self.record = path

    def _list_outputs(self) -> None:
        """Before the run ends: its outputs, for the final snapshot and the record (`zephyr verify`)."""
        path = self.status.record_path
        if path is not None:
            self.status.outputs_written(outputs_section(self.status.outputs(), path.rsplit("/", 1)[0], _earlier_record(path)))


def _earlier_record(path: str) -> dict | None:
    """The record an earlier run left at `path` (its counts of outputs this run kept), if readable."""
    try:
        return read_run_record(path)
    except (OSError, ValueError):
        return None
