"""Memory from measurement: each task's budget sized from what the stage's first tasks used.

A task's memory budget (`ShardTask.memory`) is what Ray reserves for it and what sizes its
shuffle buffers (a quarter for the scatter buffer, half for the merge's open runs). With the
`memory` option the budget is the user's, for every task, and it is also the ceiling. Without
it, the first tasks of a stage run as before (no reservation; buffers assume
`DEFAULT_TASK_MEMORY`), report their peak resident set (`zephyr.execution.usage`), and every
task submitted after them gets `HEADROOM` times the largest of the first `PROBES` peaks (never
less than `DEFAULT_TASK_MEMORY`: a smaller budget would only shrink the buffers), within the
ceiling: a share of the node's memory (`node_memory_ceiling`; on Ray, of the smallest
node's memory resource). A task killed for memory (`zephyr.out_of_memory`) is retried with
twice its budget, up to the ceiling; at the ceiling it is the user's failure.

User code reads its task's budget with `zephyr.task_memory()` (e.g. to size its own buffers).
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Callable, Iterator

from zephyr.tasks import TaskUsage

__all__ = ["DEFAULT_TASK_MEMORY", "HEADROOM", "MemorySizer", "node_memory_ceiling", "task_memory", "task_budget"]

DEFAULT_TASK_MEMORY = 1 << 30  # what buffers assume without a budget (the scatter's 256 MiB is a quarter of it)
MIN_TASK_MEMORY = 64 << 20
HEADROOM = 1.5
PROBES = 4  # results whose peaks size the rest of the stage
NODE_SHARE = 0.8  # of the node's memory, divided among the tasks that run on it at once

_current = threading.local()


def task_memory() -> int | None:
    """The memory budget, in bytes, of the shard task running in this thread (None: no budget,
    or not in a task). Zephyr sizes its shuffle buffers from it; user code may too."""
    return getattr(_current, "memory", None)


@contextlib.contextmanager
def task_budget(memory: int | None) -> Iterator[None]:
    """Make `memory` this thread's `task_memory()` for the enclosed task."""
    previous = getattr(_current, "memory", None)
    _current.memory = memory
    try:
        yield
    finally:
        _current.memory = previous


def node_memory_ceiling(tasks_at_once: int) -> int:
    """This machine's memory (its cgroup limit, if lower) times NODE_SHARE, shared among
    `tasks_at_once` tasks."""
    total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    for path in ("/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"):
        with contextlib.suppress(OSError, ValueError):
            with open(path) as f:
                total = min(total, int(f.read().strip()))
    return max(MIN_TASK_MEMORY, int(total * NODE_SHARE) // max(1, tasks_at_once))


class MemorySizer:
    """The budget of each task of one stage (see the module docstring).

    `user`: the `memory` option (bytes) or None; `ceiling`: called once, when first needed,
    for the most a task may get without the option.
    """

    def __init__(self, user: int | None, ceiling: Callable[[], int]):
        self.user = user
        self._ceiling_of = ceiling
        self._ceiling: int | None = user
        self._peaks: list[int] = []
        self.measured: int | None = None  # the budget sized from the first tasks' peaks
        self._grown: dict[int, int] = {}  # shard -> budget after it ran out of memory

    @property
    def ceiling(self) -> int:
        if self._ceiling is None:
            self._ceiling = self._ceiling_of()
        return self._ceiling

    def budget(self, shard: int) -> int | None:
        """The budget for the next attempt of `shard`."""
        if self.user is not None:
            return self.user
        return max(self._grown.get(shard, 0), self.measured or 0) or None

    def observe(self, usage: TaskUsage | None) -> None:
        """A finished task's usage; the first PROBES size the rest of the stage."""
        if self.user is not None or usage is None or len(self._peaks) >= PROBES:
            return
        # a threadpool task's process is the driver's: what the task added to it is its own
        self._peaks.append(usage.rss_rise if usage.shared else usage.peak_rss)
        # never below what buffers assume without a budget: a smaller one would only spill more
        self.measured = min(self.ceiling, max(DEFAULT_TASK_MEMORY, int(max(self._peaks) * HEADROOM)))

    def grow(self, shard: int, ran_with: int | None) -> int | None:
        """`shard` ran out of memory with budget `ran_with`: its next budget, or None when it
        already had the ceiling."""
        current = min(ran_with or DEFAULT_TASK_MEMORY, self.ceiling)
        if current >= self.ceiling:
            return None
        self._grown[shard] = min(self.ceiling, 2 * current)
        return self._grown[shard]
