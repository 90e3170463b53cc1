"""How far a stage runs in the engine, and where its plan shows the switch to records.

A stage that starts with `load_jsonl()` or `load_parquet()` (without the file path column or
`batch_mode`) followed by column-expression ops (`filter(col(...))`, `select`,
`with_columns`, `map_batches`) can run those ops in the engine on frames
(`zephyr.execution.engine_ops`). It does so only where something gains from it: a
column-expression op (or one pushdown folded into the loader), a `write_jsonl` or
`write_parquet` right after, or
a shuffle keyed by a column (`deduplicate(col("text"))`, `group_by(col("k"), ...)`) or a
`reshard`. `ZEPHYR_COLUMNAR=0` runs every stage on Python records (to compare, or to debug).
"""

from __future__ import annotations

from typing import Any

from zephyr.switches import switched_on
from zephyr.plan import ops as op
from zephyr.aggregate.grouped import PartialAggregate
from zephyr.expr.key import is_column_key
from zephyr.shuffle.scatter import HashPartition, RoundRobin, ScatterSink, keep_first

__all__ = ["COLUMN_OPS", "SWITCH_LABEL", "WRITERS", "batch_span", "enabled", "plan_labels", "takes_batches"]

COLUMN_OPS = (op.FilterExpr, op.Select, op.WithColumns, op.MapBatches, PartialAggregate)
WRITERS = (op.WriteJsonl, op.WriteParquet)  # writers that take Arrow rows as they are
SWITCH_LABEL = "to_records"


def enabled() -> bool:
    """`ZEPHYR_COLUMNAR=0` runs every stage on Python records (to compare, or to debug)."""
    return switched_on("ZEPHYR_COLUMNAR")


def batch_span(ops: tuple, sink: Any) -> int | None:
    """How many leading ops run on batches (the index of the first op handed `Pieces`), or
    None when the stage runs on records from the start."""
    if not enabled() or not ops or not isinstance(ops[0], (op.LoadJsonl, op.LoadParquet)) or ops[0].include_file_paths:
        return None
    if getattr(ops[0], "batch_mode", False):  # its items are RecordBatches already, for the user's code
        return None
    end = 1
    while end < len(ops) and isinstance(ops[end], COLUMN_OPS):
        end += 1
    folded = ops[0].filter is not None or ops[0].columns is not None  # pushdown put column ops in the loader
    gains = end > 1 or folded or (end < len(ops) and isinstance(ops[end], WRITERS)) or (end == len(ops) and takes_batches(sink))
    return end if gains else None


def takes_batches(sink: Any) -> bool:
    """Whether a stage's sink takes Arrow rows as they are: a scatter keyed by a column, or a
    reshard."""
    if not isinstance(sink, ScatterSink):
        return False
    part = sink.partitioner
    if isinstance(part, RoundRobin):
        return True
    return isinstance(part, HashPartition) and is_column_key(part.key) and part.sort_by is None and part.combiner in (None, keep_first)


def plan_labels(ops: tuple, sink: Any, labels: list[str]) -> list[str]:
    """The ops' labels with the batch path shown: `[batches]` on the loader that reads Arrow
    batches, and `to_records` where records take over (before the sink, if it needs them)."""
    end = batch_span(ops, sink)
    if end is None:
        return labels
    labels = list(labels)
    labels[0] += " [batches]"
    switch = end + 1 if end < len(ops) and isinstance(ops[end], WRITERS) else end
    if switch < len(ops) or (switch == len(ops) and sink is not None and not takes_batches(sink)):
        labels.insert(switch, SWITCH_LABEL)
    return labels
