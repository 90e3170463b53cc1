"""Second attempts of straggling shards: when a stage's last shards hold it, copy them elsewhere.

A stage that waits hours on its last shard (853 of 854 done) is most often waiting on a slow or
stuck machine, not on a big shard. Once `fraction_done` of a stage's shards are finished, a shard
whose attempt has run longer than `multiplier` times the median run time of the finished ones
(and at least `min_seconds`) gets a second attempt, on another node where the backend can choose
(Ray: not the first attempt's node). The first attempt to finish wins; the other is cancelled
and its result, counters and outputs' record are dropped (`zephyr.execution.stage_loop`).

Defaults are conservative (3x the median, at least 10 s, once 75% are done): a copy costs a
task's worth of work, and needs a free slot in the window (`max_parallelism`), which pending
shards take first. Each shard is copied at most once per stage. Configure with
`create_backend(..., speculation=...)`, `ZephyrContext(speculation=...)` or
`ZEPHYR_SPECULATION` (`off`, `on`, or `multiplier=2,min_seconds=5,fraction_done=0.5`).

Run times are measured where the work ran: a finished shard's by its worker
(`ShardResult.elapsed`), an attempt in flight from when it started running, where the backend
says (Ray's running marks), else from its submission (the local backends start each call at once).
"""

from __future__ import annotations

import os
from collections.abc import Hashable, Mapping
from dataclasses import dataclass, fields
from typing import Any

from sortedcontainers import SortedList

__all__ = ["OFF", "ENV_VAR", "Speculation", "Stragglers", "speculation_option"]

ENV_VAR = "ZEPHYR_SPECULATION"


@dataclass(frozen=True)
class Speculation:
    """When a straggling shard gets a second attempt (see the module docstring).

    Args:
        enabled: False turns second attempts off.
        multiplier: an attempt is a straggler past this many times the median run time of the
            stage's finished shards...
        min_seconds: ...and past this many seconds (short stages never copy their shards).
        fraction_done: only once this fraction of the stage's shards are finished.
    """

    enabled: bool = True
    multiplier: float = 3.0
    min_seconds: float = 10.0
    fraction_done: float = 0.75

    def __post_init__(self) -> None:
        if not isinstance(self.enabled, bool):
            raise TypeError(f"speculation enabled must be True or False, got {self.enabled!r}")
        if not self.multiplier >= 1.0:
            raise ValueError(f"speculation multiplier must be >= 1 (a copy of a shard running its peers' median time "
                             f"is no help), got {self.multiplier!r}")
        if not self.min_seconds >= 0:
            raise ValueError(f"speculation min_seconds must be >= 0, got {self.min_seconds!r}")
        if not 0 <= self.fraction_done < 1:
            raise ValueError(f"speculation fraction_done must be in [0, 1), got {self.fraction_done!r}")

    def threshold(self, median: float) -> float:
        """Seconds past which an attempt is a straggler, given the median run time of its finished peers."""
        return max(self.min_seconds, self.multiplier * median)

    def describe(self) -> str:
        if not self.enabled:
            return "off"
        return (f"past {self.multiplier:g}x the median finished shard and {self.min_seconds:g}s, "
                f"once {self.fraction_done:.0%} of the stage is done")


OFF = Speculation(enabled=False)
_WORDS = {"on": True, "1": True, "true": True, "yes": True, "off": False, "0": False, "false": False, "no": False}


def speculation_option(value: Any = None) -> Speculation:
    """A `Speculation` from an option: None (then `$ZEPHYR_SPECULATION`, else the defaults), a
    bool, a dict of `Speculation` fields, a `Speculation`, or the environment variable's text form.

    Raises ValueError (TypeError) naming the valid forms for anything else."""
    if value is None:
        text = os.environ.get(ENV_VAR, "").strip()
        return _parse(text, f"${ENV_VAR}") if text else Speculation()
    if isinstance(value, Speculation):
        return value
    if isinstance(value, bool):
        return Speculation() if value else OFF
    if isinstance(value, dict):
        return Speculation(**_known(value, "speculation"))
    if isinstance(value, str):
        return _parse(value, "speculation")
    raise TypeError(f"speculation must be a bool, a dict, a Speculation or a string like 'multiplier=2,min_seconds=5', "
                    f"got {type(value).__name__}")


def _known(values: dict, where: str) -> dict:
    names = {f.name for f in fields(Speculation)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ValueError(f"{where}: unknown setting(s) {', '.join(unknown)}; choose from {', '.join(sorted(names))}")
    return values


def _parse(text: str, where: str) -> Speculation:
    """`on`/`off` (or 1/0, true/false, yes/no), or comma-separated `name=value` settings."""
    if text.lower() in _WORDS:
        return Speculation() if _WORDS[text.lower()] else OFF
    values: dict[str, Any] = {}
    for part in filter(None, (p.strip() for p in text.split(","))):
        name, sep, raw = part.partition("=")
        if not sep:
            raise ValueError(f"{where}={text!r}: expected 'on', 'off' or name=value settings "
                             f"(e.g. 'multiplier=2,min_seconds=5,fraction_done=0.5'), got {part!r}")
        name = name.strip()
        try:
            values[name] = _WORDS[raw.strip().lower()] if name == "enabled" else float(raw)
        except (KeyError, ValueError):
            raise ValueError(f"{where}={text!r}: {name} must be {'on or off' if name == 'enabled' else 'a number'}, "
                             f"got {raw.strip()!r}") from None
    return Speculation(**_known(values, f"{where}={text!r}"))


class Stragglers:
    """One stage's watch: which attempts in flight are stragglers now.

    Fed the run time of each finished shard (`finished`) and, when asked, the start time of each
    attempt in flight; `overdue` names those to copy, longest-running first, each shard once.
    Times are the caller's clock (any monotonic seconds), so tests can pass their own. The run
    times are kept sorted (`SortedList`: O(log n) a shard), so the median costs nothing to read
    however many shards a stage has (re-sorting them for each result was quadratic).
    """

    def __init__(self, policy: Speculation, num_shards: int, done: int = 0):
        self.policy = policy
        self.num_shards = num_shards
        self.done = done  # shards finished (resumed ones included) or set aside
        self.durations = SortedList()  # run times of the shards finished in this run
        self.copied: set[int] = set()  # shards given a second attempt

    def finished(self, elapsed: float | None) -> None:
        """A shard is done (`elapsed`: its run time; None for a shard set aside)."""
        self.done += 1
        if elapsed is not None:
            self.durations.add(elapsed)

    def threshold(self) -> float | None:
        """Seconds past which an attempt is a straggler; None before the stage's tail (too few done)."""
        n = len(self.durations)
        if not self.policy.enabled or not n or self.done < self.policy.fraction_done * self.num_shards:
            return None
        median = self.durations[n // 2] if n % 2 else (self.durations[n // 2 - 1] + self.durations[n // 2]) / 2
        return self.policy.threshold(median)

    def overdue(self, now: float, running: Mapping[Hashable, tuple[int, float]]) -> list[Hashable]:
        """Of `running` (attempt -> (shard, started)), the stragglers to copy, longest-running first."""
        threshold = self.threshold()
        if threshold is None:
            return []
        late = [(started, attempt) for attempt, (shard, started) in running.items()
                if shard not in self.copied and now - started > threshold]
        return [attempt for _, attempt in sorted(late, key=lambda pair: pair[0])]
