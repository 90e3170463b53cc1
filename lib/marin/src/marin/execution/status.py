"""What each step's output directory says about the step: its status and its info file.

- `<output>/.executor_status`: `{"status", "time", "owner", "error"}`, one of RUNNING,
  SUCCESS, FAILED, PREEMPTED, DEP_FAILED. SUCCESS is written after the function returns and
  before the lease is released, so whoever takes the lease next sees it. PREEMPTED means the
  step's Ray task lost its node or worker (not a bug in the step); a rerun runs it again.
- `<output>/.executor_info`: name, description, function, version record, hash, resolved
  config, dependencies' output paths, Ray options: enough to explain and reproduce the path.
- `<output>/.executor_lease/`: the lease epochs (see `lease`).
"""

from __future__ import annotations

import datetime
import enum
from typing import Any

from marin.execution import storage

__all__ = ["StepStatus", "STATUS_FILE", "INFO_FILE", "LEASE_DIR", "read_status", "write_status", "write_info", "read_info"]

STATUS_FILE = ".executor_status"
INFO_FILE = ".executor_info"
LEASE_DIR = ".executor_lease"


class StepStatus(str, enum.Enum):
    """The states a step's status file can hold."""

    RUNNING = "RUNNING"
    SUCCESS = "SUCCESS"
    FAILED = "FAILED"
    PREEMPTED = "PREEMPTED"
    DEP_FAILED = "DEP_FAILED"


def now_iso() -> str:
    return datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds")


def read_status(output_path: str) -> StepStatus | None:
    """The status recorded under `output_path`, or None when the step never started."""
    record = storage.read_json(f"{output_path.rstrip('/')}/{STATUS_FILE}")
    return StepStatus(record["status"]) if record else None


def write_status(output_path: str, status: StepStatus, owner: str, error: str | None = None) -> None:
    """Record `status` (atomically replacing the previous one)."""
    record: dict[str, Any] = {"status": status.value, "time": now_iso(), "owner": owner}
    if error is not None:
        record["error"] = error
    storage.write_json(f"{output_path.rstrip('/')}/{STATUS_FILE}", record)


def write_info(output_path: str, info: dict[str, Any]) -> None:
    storage.write_json(f"{output_path.rstrip('/')}/{INFO_FILE}", info)


def read_info(output_path: str) -> dict[str, Any] | None:
    return storage.read_json(f"{output_path.rstrip('/')}/{INFO_FILE}")
