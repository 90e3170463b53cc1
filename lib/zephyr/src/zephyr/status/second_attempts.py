"""What the status keeps of a straggler's second attempt (`zephyr.execution.speculation`).

One `SecondAttempt` per copied shard of a stage: when and why it was copied, where the first
attempt ran (the node the copy was kept off, where the backend tells), and which attempt won.
The run record carries them, so a finished run still says which attempt made each output.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

__all__ = ["SecondAttempt"]


@dataclass
class SecondAttempt:
    shard: int
    source: str
    first: int  # the straggling attempt's number
    copy: int  # the second attempt's number
    ran_s: float  # how long the first had run when it was copied
    threshold_s: float  # the straggler threshold then
    at_s: float  # when the copy started, seconds since the run started
    submitted: float  # monotonic, for the stragglers table once the first is gone
    node: str | None = None  # where the first ran (the copy was kept off it), if the backend tells
    winner: int | None = None  # the attempt whose result was accepted
    failed: list[int] = field(default_factory=list)  # attempts that failed while the other ran on

    def decided(self, copy: bool) -> None:
        self.winner = self.copy if copy else self.first

    def to_dict(self) -> dict[str, Any]:
        won_by = None if self.winner is None else "second" if self.winner == self.copy else "first"
        return {"shard": self.shard, "source": self.source, "first_attempt": self.first, "second_attempt": self.copy,
                "ran_s": round(self.ran_s, 3), "threshold_s": round(self.threshold_s, 3), "at_s": round(self.at_s, 3),
                "first_node": self.node, "winner": self.winner, "won_by": won_by, "failed_attempts": list(self.failed)}
