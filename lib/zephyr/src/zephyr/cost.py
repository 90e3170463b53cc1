"""What a stage cost: CPU seconds, peak memory, bytes, shuffle bytes and retries by cause.

One accumulator (`StageCost`) for the runner's `StageStats` and the status model, so the run
summary, `zephyr status`, the status page and `.zephyr-run.json` agree. Figures come from each
successful task's `TaskUsage` and counters (a failed attempt's usage is not counted; its retry
is, by cause). The price, when given (`price_per_core_hour`: the backend option, or the
`ZEPHYR_PRICE_PER_CORE_HOUR` environment variable), turns CPU seconds into a cost.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from zephyr.tasks import ShardResult

__all__ = ["PRICE_ENV", "RETRY_CAUSES", "StageCost", "check_price", "price_from_env"]

PRICE_ENV = "ZEPHYR_PRICE_PER_CORE_HOUR"
RETRY_CAUSES = ("user", "lost", "storage", "memory")
"""Why an attempt was retried: the user's code or input, a lost worker or node, a transient
storage error, or the task ran out of memory (retried with more)."""


def price_from_env() -> float | None:
    """The price per core-hour from `ZEPHYR_PRICE_PER_CORE_HOUR`, or None when unset.

    Raises ValueError naming the variable when it is not a non-negative number."""
    text = os.environ.get(PRICE_ENV, "").strip()
    if not text:
        return None
    try:
        price = float(text)
    except ValueError:
        raise ValueError(f"{PRICE_ENV} must be a number (a price per core-hour, e.g. 0.05), got {text!r}") from None
    return check_price(price, PRICE_ENV)


def check_price(price: float | None, name: str = "price_per_core_hour") -> float | None:
    if price is None:
        return None
    if isinstance(price, bool) or not isinstance(price, (int, float)) or not price >= 0 or price == float("inf"):
        raise ValueError(f"{name} must be a finite number >= 0 (a price per core-hour), got {price!r}")
    return float(price)


@dataclass
class StageCost:
    """Totals over a stage's successful tasks; retries counted by cause."""

    tasks: int = 0  # tasks measured (resumed shards ran in an earlier run: not measured)
    cpu_s: float = 0.0
    task_s: float = 0.0  # wall seconds the tasks ran, summed
    peak_rss: int = 0  # the largest task's
    peak_rss_shared: bool = False  # a peak that several tasks of one process shared (threadpool)
    rss_rise: int = 0  # the most a task raised its process's resident set above where it started
    bytes_read: int = 0  # input files' bytes fetched from storage, as stored (compressed)
    bytes_decoded: int = 0  # JSON Lines inputs' bytes after decompression
    bytes_written: int = 0
    shuffle_bytes_written: int = 0
    shuffle_bytes_read: int = 0
    memory_budget: int | None = None  # the largest budget a task ran with (bytes), None: none
    retries: dict = field(default_factory=lambda: dict.fromkeys(RETRY_CAUSES, 0))

    def add(self, result: ShardResult, memory: int | None = None) -> None:
        """A successful task's result (and the budget it ran with)."""
        c = result.counters
        self.bytes_read += c.get("zephyr/bytes_read", 0)
        self.bytes_decoded += c.get("zephyr/bytes_decoded", 0)
        self.bytes_written += c.get("zephyr/bytes_written", 0)
        self.shuffle_bytes_written += c.get("zephyr/shuffle_bytes_written", 0)
        self.shuffle_bytes_read += c.get("zephyr/shuffle_bytes_read", 0)
        if memory is not None:
            self.memory_budget = max(self.memory_budget or 0, memory)
        usage = result.usage
        if usage is None:
            return
        self.tasks += 1
        self.cpu_s += usage.cpu_s
        self.task_s += result.elapsed
        self.rss_rise = max(self.rss_rise, usage.rss_rise)
        if usage.peak_rss > self.peak_rss:
            self.peak_rss, self.peak_rss_shared = usage.peak_rss, usage.shared

    def retried(self, cause: str) -> None:
        if cause not in self.retries:
            raise ValueError(f"retry cause must be one of {', '.join(RETRY_CAUSES)}, got {cause!r}")
        self.retries[cause] += 1

    def to_dict(self, price_per_core_hour: float | None = None) -> dict:
        """JSON-ready, with `cost` (CPU hours times the price) when a price is given."""
        out = {k: v for k, v in self.__dict__.items() if k != "retries"}
        out["cpu_s"] = round(self.cpu_s, 3)
        out["task_s"] = round(self.task_s, 3)
        out["retries"] = dict(self.retries)
        out["cost"] = None if price_per_core_hour is None else round(self.cpu_s / 3600 * price_per_core_hour, 6)
        return out
