"""Pushdown: fold `select(...)` and expression filters that follow a loader into the loader.

    load_parquet() -> filter(col("score") > 0.9) -> select("id", "text")
        becomes  load_parquet(columns=['id', 'text'], filter=(col('score') > lit(0.9)))

so Parquet reads only the needed column chunks and skips row groups whose statistics rule
the filter out (JSON Lines applies the same projection and filter per record). The result
is the same as without pushdown; these are the conditions under which folding keeps it so:

- only `select(...)` and `filter(<expression>)` fold, and only while they follow the loader
  directly (a `map` or a Python `filter` in between stops folding);
- a filter folds only when every column it reads is still there (one that reads a column a
  projection dropped is refused when planning, `zephyr.plan.column_check`; were it not, it
  would stay in place and see nulls);
- a filter that reads the file path column (`include_file_paths`) is left in place: the
  reader adds that column after filtering;
- a later projection narrows an earlier one (keeping the later order); a projection that
  leaves out the file path column (with `include_file_paths`) raises DroppedPathColumnError;
- a folded filter goes into pyarrow only where it provably gives Python's result for that
  file's schema (`zephyr.expr.arrow`); otherwise the reader evaluates it on the rows.
"""

from __future__ import annotations

from dataclasses import replace

from zephyr.errors import PlanError
from zephyr.plan import ops as op
from zephyr.expr import referenced_columns

__all__ = ["DroppedPathColumnError", "push_down"]


class DroppedPathColumnError(PlanError, RuntimeError):
    """A `select` right after a loader with `include_file_paths` that leaves the path column out.

    A RuntimeError too, as the reference project raises."""

_LOADS = op.LOAD_OPS


def push_down(ops: tuple) -> tuple:
    """The op chain with selects and expression filters folded into the loaders before them.

    Returns the same tuple object when nothing folds.
    """
    out: list = []
    changed = False
    for record in ops:
        folded = _fold(out[-1], record) if out and isinstance(out[-1], _LOADS) else None
        if folded is None:
            out.append(record)
        else:
            out[-1] = folded
            changed = True
    return tuple(out) if changed else ops


def _fold(load, record):
    """`load` with `record` folded in, or None when it cannot fold (see the module docstring)."""
    if isinstance(record, op.Select):
        path_column = load.file_path_column if load.include_file_paths else None
        columns = record.columns if load.columns is None else tuple(c for c in record.columns if c in load.columns or c == path_column)
        if load.include_file_paths and load.file_path_column not in columns:
            raise DroppedPathColumnError(
                f"Column filter must include file path column {load.file_path_column!r}: {record.describe()} right after "
                f"{load.describe()} would drop the column include_file_paths adds; select it too, or leave "
                "include_file_paths off")
        return replace(load, columns=columns)
    if isinstance(record, op.FilterExpr):
        needed = referenced_columns(record.expr)
        if load.columns is not None and not needed <= set(load.columns):
            return None
        if load.include_file_paths and load.file_path_column in needed:
            return None
        combined = record.expr if load.filter is None else load.filter & record.expr
        return replace(load, filter=combined)
    return None
