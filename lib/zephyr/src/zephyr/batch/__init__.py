"""The batch path: pipelines written with column expressions run on Arrow record batches.

A stage that starts with `load_jsonl()` followed by column-expression ops (`filter(col(...))`,
`select`, `with_columns`, `map_batches`) reads its files into pyarrow tables a block of lines
at a time (`rows`), applies those ops with pyarrow.compute (`stage`), and hands the batches on
as they are to a `write_jsonl` (`encode` writes each row's JSON line without a Python record)
or to a shuffle keyed by a column (`keys`: key bytes and hashes in Arrow). The first op that
needs Python records (a `map`, a Python `filter`, ...) gets them from the batches: the plan
shows that switch as `to_records`.

Everything here is exact: a block goes columnar only when its Arrow table, written back as
JSON lines, gives the block's bytes exactly (so the table holds what `read_jsonl` would have
read, and the output is what the record path writes); an expression goes to pyarrow only where
`zephyr.expr_arrow` proves it agrees with Python. Anything else runs on records, block by
block. `ZEPHYR_COLUMNAR=0` turns the batch path off.
"""

from __future__ import annotations

import os

__all__ = ["enabled"]


def enabled() -> bool:
    """`ZEPHYR_COLUMNAR=0` runs every stage on Python records (to compare, or to debug)."""
    return os.environ.get("ZEPHYR_COLUMNAR", "1").lower() not in ("0", "false", "no", "off")
