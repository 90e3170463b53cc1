"""A column expression used as a shuffle key (`deduplicate(col("text"))`, `group_by(col("k"), ...)`).

A key is a callable on records everywhere in zephyr; this one is also data, so the engine can
hash a plain column's values natively (`zephyr.shuffle.frame_keys`) and plans print it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from zephyr.expr.nodes import Column

__all__ = ["ExprKey", "is_column_key"]


@dataclass(frozen=True)
class ExprKey:
    """A column expression used as a shuffle key: its value for each record."""

    expr: Any = field(compare=False)  # a zephyr.expr.Expr
    expr_text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "expr_text", repr(self.expr))

    def __call__(self, record: Any) -> Any:
        return self.expr.evaluate(record)

    def name_for_plan(self) -> str:
        return self.expr_text


def is_column_key(key: Any) -> bool:
    """Whether a shuffle key is a plain column (`col("text")`)."""
    return isinstance(key, ExprKey) and isinstance(key.expr, Column)
