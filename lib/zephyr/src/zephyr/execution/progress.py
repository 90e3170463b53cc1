"""What a person watches while a run goes: a tqdm bar per stage (the summary at its end is
`zephyr.execution.summary`).

Bars show shards done/total with items/s, input MB/s and an ETA; they appear only on a
terminal unless asked for (`progress=True`) and never with `progress=False` (`--quiet`).
"""

from __future__ import annotations

import sys
import time
from typing import TYPE_CHECKING

from zephyr.resources import format_bytes

if TYPE_CHECKING:
    from zephyr.plan.compile import Stage
    from zephyr.tasks import ShardResult

__all__ = ["format_largest", "make_progress"]


class _NoProgress:
    def update(self, result: ShardResult) -> None:
        pass

    def close(self) -> None:
        pass


class _StageBar:
    def __init__(self, stage: Stage, largest: list = ()):
        from tqdm import tqdm

        self._bar = tqdm(total=stage.num_shards, desc=f"stage {stage.index}", unit="shard", file=sys.stderr, leave=True)
        self._note = f", largest {format_largest(largest[:1])}" if largest else ""
        self._start = time.perf_counter()
        self._items = 0
        self._bytes = 0

    def update(self, result: ShardResult) -> None:
        # the records the shard read: a write or a shuffle hands back no items, and counted 0 items/s
        self._items += result.items_in or result.num_items or result.counters.get("zephyr/records_written", 0)
        self._bytes += result.counters.get("zephyr/bytes_read", 0)
        elapsed = max(time.perf_counter() - self._start, 1e-9)
        self._bar.set_postfix_str(f"{self._items / elapsed:,.0f} items/s, {self._bytes / elapsed / 1e6:,.1f} MB/s in{self._note}", refresh=False)
        self._bar.update(1)

    def close(self) -> None:
        self._bar.close()


def make_progress(enabled: bool | None, stage: Stage, largest: list = ()):
    """A bar for `stage` when enabled (None: only if stderr is a terminal); after a shuffle,
    `largest` (the biggest partitions) shows in its description."""
    if enabled is None:
        enabled = sys.stderr.isatty()
    return _StageBar(stage, largest) if enabled else _NoProgress()


def format_largest(largest: list) -> str:
    """'partition 3: 412.0 MB in 16 key ranges, partition 0: 9.1 MB' (shuffle bytes)."""
    return ", ".join(
        f"partition {p.partition}: {format_bytes(p.bytes)}" + (f" in {p.pieces} key ranges" if p.pieces > 1 else "") for p in largest
    )
