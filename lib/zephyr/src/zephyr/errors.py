"""Errors a run reports: a user failure names the shard, its source and the original traceback."""

from __future__ import annotations

__all__ = ["ShardError", "PlanError"]


class PlanError(ValueError):
    """The pipeline cannot run as written; raised before any task starts."""


class ShardError(RuntimeError):
    """A user function (or bad input) failed while processing one shard.

    Carries the stage, shard index, a short description of the shard's source (e.g. its file)
    and the formatted original traceback, so the message is useful even when the original
    exception object could not travel back from a remote worker.
    """

    def __init__(self, stage: int, shard: int, source: str, error_type: str, error_message: str, traceback_text: str):
        self.stage = stage
        self.shard = shard
        self.source = source
        self.error_type = error_type
        self.error_message = error_message
        self.traceback_text = traceback_text
        super().__init__(
            f"stage {stage}, shard {shard} (source: {source}) failed with {error_type}: {error_message}\n"
            f"--- original traceback ---\n{traceback_text.rstrip()}"
        )

    def __reduce__(self):
        return (
            ShardError,
            (self.stage, self.shard, self.source, self.error_type, self.error_message, self.traceback_text),
        )
