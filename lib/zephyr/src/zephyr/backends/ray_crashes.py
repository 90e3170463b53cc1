"""Ray worker processes of this driver's job that crashed: what a run reports, so none dies unsaid.

Ray hides two kinds of worker death from the runner. A worker that dies mid-task (a segfault, an
abort, the OOM killer) is recorded by Ray's GCS as a `SYSTEM_ERROR` (or `NODE_OUT_OF_MEMORY`)
exit, and Ray retries its task itself (`ray_task_retries`), so the run succeeds without a word
from zephyr. A worker that crashes while exiting after its tasks finished (Ray reaps idle
workers; its C++ shutdown can abort, e.g. absl's "Mutex corrupt: both reader and writer lock
held") is recorded as an intended exit; only its crash dump, which Ray forwards to the driver's
stderr, shows it. `CrashWatch` reads both: the GCS worker table (one request, when asked) and the
forwarded log lines (a handler on Ray's log stream, when the driver logs workers' output, as
`log_to_driver=True` does).
"""

from __future__ import annotations

import logging
import re
import threading
import time

__all__ = ["CrashWatch"]

# A line of a crash dump: absl's failure signal handler, Python's faulthandler, a failed check
_CRASH_LINE = re.compile(r"\*\*\* SIG[A-Z]+ received|Fatal Python error|Mutex corrupt|Check failed|Segmentation fault")
_CRASH_EXITS = ("SYSTEM_ERROR", "NODE_OUT_OF_MEMORY")
_LINES_KEPT = 3  # crash lines kept per process

logger = logging.getLogger("zephyr")


class CrashWatch:
    """The crashes of this job's worker processes, from Ray's GCS and from their forwarded logs."""

    def __init__(self):
        self._name = f"zephyr-crash-watch-{id(self)}"
        self._logged: dict[tuple[str, int], dict] = {}  # (host, pid) -> what its log said
        self._lock = threading.Lock()
        self._watching = False

    def start(self) -> None:
        """Read the worker output Ray forwards to this driver (a no-op where it forwards none)."""
        from ray._private.worker import global_worker_stdstream_dispatcher

        global_worker_stdstream_dispatcher.add_handler(self._name, self._saw)
        self._watching = True

    def stop(self) -> None:
        if self._watching:
            from ray._private.worker import global_worker_stdstream_dispatcher

            global_worker_stdstream_dispatcher.remove_handler(self._name)
            self._watching = False

    def _saw(self, data: dict) -> None:
        try:
            pid = int(data.get("pid"))
        except (TypeError, ValueError):  # the raylet's and the autoscaler's own lines
            return
        lines = [line for line in data.get("lines") or () if _CRASH_LINE.search(line)]
        if not lines:
            return
        with self._lock:
            entry = self._logged.setdefault((str(data.get("ip") or "?"), pid), {
                "pid": pid, "host": str(data.get("ip") or "?"), "task": data.get("task_name") or None,
                "exit": None, "detail": None, "log": [], "at": time.time()})
            entry["log"] = (entry["log"] + [line.strip() for line in lines])[:_LINES_KEPT]

    def crashes(self, since: float) -> list[dict]:
        """Each worker of this job that crashed at or after `since` (epoch seconds): `pid`, `host`,
        `task`, `exit` and `detail` (Ray's record of its exit), `log` (its crash lines), `at`."""
        try:
            recorded = _gcs_crashes(since)
        except Exception as e:  # noqa: BLE001 - the forwarded logs still count; the gap is said
            logger.warning("zephyr: cannot read Ray's worker table, so worker crashes that Ray retried may go "
                           "unreported: %s: %s", type(e).__name__, e)
            recorded = []
        found = {(c["host"], c["pid"]): c for c in recorded}
        with self._lock:
            logged = [dict(entry) for entry in self._logged.values() if entry["at"] >= since]
        for entry in logged:
            key = (entry["host"], entry["pid"])
            if key in found:
                found[key]["log"] = entry["log"]
                found[key]["task"] = found[key]["task"] or entry["task"]
            else:
                found[key] = entry
        return sorted(found.values(), key=lambda c: c["at"])


def _gcs_crashes(since: float) -> list[dict]:
    """This job's workers that the GCS recorded as dead by a crash or the OOM killer since `since`."""
    import ray
    from ray._private.state import state
    from ray.core.generated import common_pb2, gcs_pb2

    job = ray.get_runtime_context().get_job_id()
    out = []
    for raw in state._connect_and_get_accessor().get_worker_table():
        worker = gcs_pb2.WorkerTableData.FromString(raw)
        exit_type = common_pb2.WorkerExitType.Name(worker.exit_type)
        if worker.is_alive or worker.job_id.hex() != job or exit_type not in _CRASH_EXITS:
            continue
        if worker.end_time_ms and worker.end_time_ms / 1000 < since:
            continue
        out.append({"pid": worker.pid, "host": worker.worker_address.ip_address or "?", "task": None, "exit": exit_type,
                    "detail": worker.exit_detail.split(". ")[0], "log": [],
                    "at": worker.end_time_ms / 1000 if worker.end_time_ms else time.time()})
    return out
