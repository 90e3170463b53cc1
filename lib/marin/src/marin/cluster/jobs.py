"""Job operations over Ray's job API: list, logs, stop, wait, and the restart snapshot.

`snapshot()` records the jobs that are pending or running so that `restore()` can resubmit
them, under the same submission ids, after a cluster restart. A job's uploaded working dir
does not survive the restart (it lived in the old head's storage), so it is re-packaged from
the directory recorded at submission (`marin_working_dir` in the job metadata, set by
`ray_run`); jobs whose directory cannot be found are reported and skipped.
"""

from __future__ import annotations

import datetime as dt
import json
import os
import sys
import time
from pathlib import Path
from typing import Any, TextIO

__all__ = [
    "ACTIVE",
    "TERMINAL",
    "follow_logs",
    "format_jobs",
    "restore",
    "snapshot",
    "wait_for",
]

ACTIVE = {"PENDING", "RUNNING"}
TERMINAL = {"SUCCEEDED", "FAILED", "STOPPED"}
WORKING_DIR_KEY = "marin_working_dir"
_RESUBMIT_FIELDS = ("entrypoint_num_cpus", "entrypoint_num_gpus", "entrypoint_memory", "entrypoint_resources")


def _status(job) -> str:
    return str(getattr(job.status, "value", job.status))


def format_jobs(jobs) -> str:
    """One line per submitted job, newest first: id, status, start time, entrypoint."""
    rows = []
    for job in sorted(jobs, key=lambda j: j.start_time or 0, reverse=True):
        if job.submission_id is None:  # drivers that called ray.init() themselves
            continue
        start = "-"
        if job.start_time:
            start = dt.datetime.fromtimestamp(job.start_time / 1000).strftime("%Y-%m-%d %H:%M:%S")
        entry = job.entrypoint if len(job.entrypoint) <= 80 else job.entrypoint[:77] + "..."
        rows.append(f"{job.submission_id:<32} {_status(job):<10} {start:<20} {entry}")
    header = f"{'SUBMISSION ID':<32} {'STATUS':<10} {'START':<20} ENTRYPOINT"
    return "\n".join([header, *rows]) if rows else "No jobs."


def follow_logs(client, job_id: str, out: TextIO = sys.stdout, max_poll: float = 5.0) -> str:
    """Print a job's logs as they grow until it finishes; returns its final status.

    Polls the log endpoint (0.5 s at first, backing off to `max_poll`): Ray's websocket tail
    closes ~10 s after the job ends, which this avoids.
    """
    seen, poll = 0, 0.5
    while True:
        status = str(client.get_job_status(job_id).value)
        logs = client.get_job_logs(job_id)
        if len(logs) > seen:
            out.write(logs[seen:])
            out.flush()
            seen, poll = len(logs), 0.5
        if status in TERMINAL:
            return status
        time.sleep(poll)
        poll = min(poll * 1.5, max_poll)


def wait_for(client, job_id: str, timeout: float | None = None, poll: float = 1.0) -> str:
    """Block until the job reaches a terminal status (or `timeout`); returns the status."""
    deadline = None if timeout is None else time.monotonic() + timeout
    while True:
        status = str(client.get_job_status(job_id).value)
        if status in TERMINAL:
            return status
        if deadline is not None and time.monotonic() > deadline:
            raise TimeoutError(f"Job {job_id} is still {status} after {timeout:.0f}s")
        time.sleep(poll)


def snapshot(client) -> list[dict[str, Any]]:
    """Specs of every pending or running submitted job, enough to resubmit it."""
    records = []
    for job in client.list_jobs():
        if job.submission_id is None or _status(job) not in ACTIVE:
            continue
        record: dict[str, Any] = {
            "submission_id": job.submission_id,
            "entrypoint": job.entrypoint,
            "metadata": dict(job.metadata or {}),
            "runtime_env": dict(job.runtime_env or {}),
        }
        for name in _RESUBMIT_FIELDS:
            if (value := getattr(job, name, None)) is not None:
                record[name] = value
        records.append(record)
    return records


def save_snapshot(records: list[dict[str, Any]], path: Path) -> Path:
    """Write the snapshot privately: runtime envs may hold secret environment values."""
    path.parent.mkdir(parents=True, exist_ok=True)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        json.dump(records, f, indent=2)
    return path


def _runtime_env_for_resubmit(record: dict[str, Any]) -> dict[str, Any] | None:
    """The job's runtime env with uploaded packages replaced by their source directory."""
    env = dict(record.get("runtime_env") or {})
    working_dir = env.get("working_dir")
    if isinstance(working_dir, str) and working_dir.startswith("gcs://"):
        source = record.get("metadata", {}).get(WORKING_DIR_KEY)
        if not source or not Path(source).is_dir():
            return None
        env["working_dir"] = source
    if any(str(m).startswith("gcs://") for m in env.get("py_modules") or []):
        return None  # uploaded modules have no recorded source
    return env


def restore(client, records: list[dict[str, Any]]) -> tuple[list[str], list[str]]:
    """Resubmit recorded jobs; returns (resubmitted ids, skipped ids with reasons)."""
    resubmitted, skipped = [], []
    for record in records:
        runtime_env = _runtime_env_for_resubmit(record)
        if runtime_env is None:
            skipped.append(f"{record['submission_id']} (its working dir was not recorded or is gone)")
            continue
        kwargs = {name: record[name] for name in _RESUBMIT_FIELDS if name in record}
        try:
            client.submit_job(
                entrypoint=record["entrypoint"],
                submission_id=record["submission_id"],
                runtime_env=runtime_env,
                metadata=record.get("metadata") or None,
                **kwargs,
            )
        except Exception as e:
            skipped.append(f"{record['submission_id']} ({type(e).__name__}: {str(e)[:200]})")
            continue
        resubmitted.append(record["submission_id"])
    return resubmitted, skipped
