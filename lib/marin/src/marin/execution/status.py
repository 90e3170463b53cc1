"""What each step's output directory says about the step: its status and its info file.

- `<output>/.executor_status`: just the status token, as Marin's own tools read it:
  RUNNING, SUCCESS, FAILED, DEP_FAILED, PREEMPTED (the step's Ray task lost its node or
  worker) or INTERRUPTED (SIGINT/SIGTERM stopped the executor while the step ran). Marin's
  executor, which does not know the last two tokens, simply runs such a step again, as this
  one does. SUCCESS is written after the function returns and before the lease is
  released, so whoever takes the lease next sees it. Older status files are still read: a
  JSON object `{"status", "time", "owner", "error"}` (this executor's earlier format) or
  JSON lines of events (Marin's earlier format, the last `status` wins).
- Who ran the step, when, and the error it failed with live in the lease (see `lease`):
  each epoch records its owner, heartbeat and, on release, its outcome and error.
  `read_step_record` puts the two together.
- `<output>/.executor_info`: name, description, function, version record, hash, resolved
  config, dependencies' output paths, Ray options: enough to explain and reproduce the path.
- `<output>/.executor_lease/`: the lease epochs (see `lease`).
"""

from __future__ import annotations

import datetime
import enum
import json
from typing import Any

from marin.execution import storage
from marin.execution.lease import Lease

__all__ = [
    "INFO_FILE",
    "LEASE_DIR",
    "STATUS_FILE",
    "StepStatus",
    "read_info",
    "read_status",
    "read_step_record",
    "write_info",
    "write_status",
]

STATUS_FILE = ".executor_status"
INFO_FILE = ".executor_info"
LEASE_DIR = ".executor_lease"


class StepStatus(str, enum.Enum):
    """The states a step's status file can hold."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    INTERRUPTED = "INTERRUPTED"
    DEP_FAILED = "DEP_FAILED"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def _status_path(output_path: str) -> str:
    return f"{output_path.rstrip('/')}/{STATUS_FILE}"


def _parse(text: str) -> tuple[str | None, dict[str, Any]]:
    """(status token, extra fields of the legacy JSON forms) of a status file's text."""
    text = text.strip()
    if not text:
        return None, {}
    if not text.startswith("{"):
        return text.split()[0], {}
    try:
        record = json.loads(text)  # this executor's earlier format: one JSON object
        return record.get("status"), record
    except json.JSONDecodeError:
        pass
    status, last = None, {}
    for line in text.splitlines():  # Marin's earlier format: one JSON event per line
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and isinstance(event.get("status"), str):
            status, last = event["status"], event
    return status, last


def _read_raw(output_path: str) -> tuple[str | None, dict[str, Any]]:
    fs, fs_path = storage.filesystem(_status_path(output_path))
    try:
        data = fs.cat_file(fs_path)
    except FileNotFoundError:
        return None, {}
    return _parse(data.decode("utf-8", errors="replace"))


def read_status(output_path: str) -> StepStatus | None:
    """The status recorded under `output_path`, or None when the step never started.

    Reads the status token, and the older JSON forms too. An unknown token reads as None
    (not started), as in Marin's executor.
    """
    status, _ = _read_raw(output_path)
    try:
        return StepStatus(status) if status else None
    except ValueError:
        return None


def write_status(output_path: str, status: StepStatus) -> None:
    """Record `status` as the bare token (atomically replacing the previous one)."""
    storage.write_text(_status_path(output_path), StepStatus(status).value)


def read_step_record(output_path: str) -> dict[str, Any] | None:
    """`{"status", "owner", "time", "error"}` of a step, or None when it never started.

    The status comes from the status file; owner, time (ISO 8601) and error from the newest
    lease epoch that recorded that outcome (or, for RUNNING, that holds the step now): a
    later epoch released without an outcome (an executor that took the lease and found the
    step already failed, or was interrupted before running it) does not hide the error.
    Fields that nothing recorded are None; a legacy JSON status file supplies its own.
    """
    status, legacy = _read_raw(output_path)
    if not status:
        return None
    record = {"status": status, "owner": legacy.get("owner"), "time": legacy.get("time"), "error": legacy.get("error")}
    if legacy:
        return record
    lease = Lease(f"{output_path.rstrip('/')}/{LEASE_DIR}")
    holder = lease.current()
    if holder and holder.get("outcome") != status and not (status == StepStatus.RUNNING.value and not holder.get("released")):
        # look back past epochs released without an outcome (newest first)
        holder = next((r for r in reversed(lease.records_since(0)) if r.get("outcome") == status), None)
    if holder and (holder.get("outcome") == status or (status == StepStatus.RUNNING.value and not holder.get("released"))):
        when = datetime.datetime.fromtimestamp(float(holder["heartbeat"]), datetime.timezone.utc)
        record.update(owner=holder.get("owner"), time=when.isoformat(timespec="seconds"), error=holder.get("error"))
    return record


def write_info(output_path: str, info: dict[str, Any]) -> None:
    storage.write_json(f"{output_path.rstrip('/')}/{INFO_FILE}", info)


def read_info(output_path: str) -> dict[str, Any] | None:
    return storage.read_json(f"{output_path.rstrip('/')}/{INFO_FILE}")
