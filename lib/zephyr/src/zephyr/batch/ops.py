"""Op records of the batch path (`with_columns`, `map_batches`) and expression keys.

They run on Python records too (`zephyr.shard` registers how), so a pipeline gives the same
output whichever path a stage takes.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from zephyr.ops import callable_name

__all__ = ["ExprKey", "MapBatches", "WithColumns"]


@dataclass(frozen=True)
class WithColumns:
    """Set columns to expression values, all computed from the record as it comes in: an
    existing column keeps its place, a new one goes last (in the order given)."""

    columns: tuple = field(compare=False)  # ((name, zephyr.expr.Expr), ...)
    columns_text: str = field(init=False, repr=False)

    def __post_init__(self) -> None:
        object.__setattr__(self, "columns_text", self.describe())

    def describe(self) -> str:
        return f"with_columns({', '.join(f'{name}={expr!r}' for name, expr in self.columns)})"

    def apply(self, record: Any) -> dict:
        if not isinstance(record, dict):
            raise TypeError(f"{self.describe()} needs dict records, got {type(record).__name__}: {record!r:.80}")
        values = [(name, expr.evaluate(record)) for name, expr in self.columns]
        out = dict(record)
        out.update(values)
        return out


@dataclass(frozen=True)
class MapBatches:
    """`fn(pyarrow.Table) -> pyarrow.Table` over batches of rows (at most `batch_size` of them
    on the record path; a block of the input on the batch path)."""

    fn: Callable[[Any], Any]
    batch_size: int = 4096

    def describe(self) -> str:
        return f"map_batches({callable_name(self.fn)})"


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
