"""Errors a run reports, and how a failure is classified for retries.

A user failure names the shard, its source and the original traceback (`ShardError`). A
transient storage error (a 5xx, a timeout, a dropped connection that outlived the storage
client's own retries) is the infrastructure's fault, not the user's: `is_transient_storage_error`
recognises it, the shard's `ShardError` says so (`transient=True`), and the runner retries it as
a lost attempt with backoff instead of charging the user's retry budget. A permanent storage
error (403, 404) stays a user failure and fails fast, naming the path and the shard.
"""

from __future__ import annotations

import os
from types import TracebackType

__all__ = ["InputNotFoundError", "MissingColumnError", "NotConvergedError", "PlanError", "ShardError", "TaskLost", "is_transient_storage_error"]

# Where an error was raised tells a storage call (our I/O layer or a filesystem client) from a
# user function's own network call: the innermost frame outside the network stack must be one
# of these packages.
_STORAGE = tuple(f"{os.sep}{name}{os.sep}" for name in ("fsspec", "gcsfs", "s3fs", "adlfs", os.path.join("zephyr", "io")))
_NETWORK = tuple(f"{os.sep}{name}{os.sep}" for name in ("aiohttp", "requests", "urllib3", "google", "asyncio", "http"))
_TRANSIENT_STATUS = {408, 429, 500, 502, 503, 504}
_NETWORK_MODULES = tuple(f"{os.sep}{name}.py" for name in ("socket", "ssl", "selectors"))


class PlanError(ValueError):
    """The pipeline cannot run as written; raised before any task starts."""


class MissingColumnError(PlanError):
    """An op names a column its input cannot have: one a Parquet or Vortex input's schema lacks,
    or one an earlier `select` left out (`zephyr.plan.column_check`). Raised before anything runs."""


class NotConvergedError(RuntimeError):
    """`deduplicate_fuzzy`'s star rounds used their budget (`cc_rounds`) before every component
    became one star: raise `cc_rounds`. Raised by the run itself between rounds, never by a task,
    so nothing retries or quarantines it."""


class InputNotFoundError(FileNotFoundError):
    """An input file (or pattern) of the pipeline is not there: zephyr's own message names it.
    A FileNotFoundError, so callers that catch that still do; the `zephyr` command prints it
    as one line, where a user's own FileNotFoundError keeps its traceback."""


class ShardError(RuntimeError):
    """A user function (or bad input, or storage) failed while processing one shard.

    Carries the stage, shard index, a short description of the shard's source (e.g. its file)
    and the formatted original traceback, so the message is useful even when the original
    exception object could not travel back from a remote worker. `transient` marks a storage
    error worth retrying (see `is_transient_storage_error`).
    """

    def __init__(
        self,
        stage: int,
        shard: int,
        source: str,
        error_type: str,
        error_message: str,
        traceback_text: str,
        transient: bool = False,
        record: str | None = None,
    ):
        self.stage = stage
        self.shard = shard
        self.source = source
        self.error_type = error_type
        self.error_message = error_message
        self.traceback_text = traceback_text
        self.transient = transient
        self.record = record  # which record a per-item function failed on (`zephyr.execution.failed_record`)
        kind = " (a transient storage error)" if transient else ""
        where = f"\n  at {record}" if record else ""
        super().__init__(
            f"stage {stage}, shard {shard} (source: {source}) failed with {error_type}{kind}: {error_message}{where}\n"
            f"--- original traceback ---\n{traceback_text.rstrip()}"
        )

    def __reduce__(self):
        return (
            ShardError,
            (self.stage, self.shard, self.source, self.error_type, self.error_message, self.traceback_text, self.transient,
             self.record),
        )


class TaskLost(Exception):
    """A task died for reasons outside the user's code (worker crash, node preempted): a
    backend raises it, the runner resubmits the task without charging the user's retries."""


def is_transient_storage_error(error: BaseException) -> bool:
    """Whether `error` (or an exception it was raised from) is a transient failure of a storage call.

    Transient: what gcsfs itself retries (HTTP 408/429/5xx, dropped or refused connections,
    timeouts, auth refreshes), builtin `TimeoutError`/`ConnectionError` and fsspec's timeout,
    when raised by filesystem code (fsspec, gcsfs, s3fs, adlfs, `zephyr.io`, or the network
    stack under them). Not transient: 403, 404 and anything else; and errors raised by a user
    function's own network calls.
    """
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if _retriable(current) and _through_storage(current.__traceback__):
            return True
        current = current.__cause__ or current.__context__
    return False


def _retriable(error: BaseException) -> bool:
    if isinstance(error, (FileNotFoundError, PermissionError)):
        return False
    status = getattr(error, "status", None) or getattr(error, "code", None)  # an HTTP answer
    if isinstance(status, int) and 100 <= status < 600:
        return status in _TRANSIENT_STATUS
    if isinstance(error, (TimeoutError, ConnectionError)):
        return True
    try:
        from fsspec.exceptions import FSTimeoutError
        from gcsfs.retry import is_retriable
    except ImportError:  # gcsfs is optional: then only the builtin kinds above count
        return False
    return isinstance(error, FSTimeoutError) or is_retriable(error)


def _through_storage(tb: TracebackType | None) -> bool:
    """Whether the innermost frame of `tb` outside the network stack is filesystem code."""
    files = []
    while tb is not None:
        files.append(tb.tb_frame.f_code.co_filename)
        tb = tb.tb_next
    for name in reversed(files):
        if any(package in name for package in _STORAGE):
            return True
        if not (any(package in name for package in _NETWORK) or name.endswith(_NETWORK_MODULES)):
            return False  # raised by (or through) user code
    return False
