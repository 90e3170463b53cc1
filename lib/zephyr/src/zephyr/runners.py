"""The reference project's stage runners, so that `ZephyrContext(stage_runner_factory=...)`
code runs unchanged.

In the reference a runner decides where a worker runs one shard: in its own process
(`InlineRunner`) or in a fresh subprocess (`SubprocessRunner`). Here shard tasks run in the
backend's workers (Ray workers are processes of their own), and the chunks of a split shard
(`IntraShardExecution.AUTO`, `zephyr.execution.intra_shard`) always run in fresh processes, so
both names are accepted and mean the same.
"""

from __future__ import annotations

__all__ = ["InlineRunner", "SubprocessRunner"]


class InlineRunner:
    """Accepted as a `stage_runner_factory`; `num_workers` as in the reference."""

    def __init__(self, num_workers: int = 1) -> None:
        self.num_workers = num_workers


class SubprocessRunner(InlineRunner):
    """Accepted as a `stage_runner_factory`; split chunks run in fresh processes in any case."""
