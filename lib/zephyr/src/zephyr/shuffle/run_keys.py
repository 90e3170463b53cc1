"""Key bytes of the rows of a columnar run, stored or recomputed from the payload.

A run of a shuffle keyed by a plain column (`deduplicate(col("text"))`, `group_by(col("k"), ...)`)
does not store the key bytes `kb`: the key is a field of every payload row, so the reduce
recomputes them (`zephyr.canonical.key_bytes` of the row's field, which is what the map side
hashed) for the few rows that need them: those whose hash equals a neighbour's, where equal
hashes must be told apart from equal keys. For an exact dedup the key's text was otherwise
carried twice, about 40% of a spill's bytes (benchmarks/README.md, sections 29 and 33). The
run's schema metadata names the field (`KEY_META`); runs of any other key keep `kb`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import pyarrow as pa

from zephyr.canonical import key_bytes
from zephyr.expr.key import is_column_key
from zephyr.shuffle.columnar import key_of, payload_columns, records_of

__all__ = ["KEY_META", "batch_rows", "column_of_key", "group_key", "key_bytes_at", "without_key_bytes"]

KEY_META = b"zephyr.key_column"


def column_of_key(key: Any) -> str | None:
    """The payload field a shuffle key reads (a plain column key), or None (a Python key function:
    its runs keep `kb`)."""
    return key.expr.name if is_column_key(key) else None


def without_key_bytes(table: pa.Table, column: str) -> pa.Table:
    """`table` without `kb`, its schema naming the field the key bytes are recomputed from."""
    table = table.drop_columns(["kb"])
    return table.replace_schema_metadata({**(table.schema.metadata or {}), KEY_META: column.encode()})


def _key_column(data: pa.Table | pa.RecordBatch) -> str:
    return data.schema.metadata[KEY_META].decode()


def batch_rows(batch: pa.RecordBatch, keyed: bool) -> Iterator[tuple]:
    """`(h, kb, sort value, origin shard, pos, key, item)` per row of a shuffle batch (key None
    unless keyed; the shard None unless the batch has a column of them, `zephyr.shuffle.origin`)."""
    items = records_of(*payload_columns(batch))
    names = batch.schema.names
    if "kb" in names:
        kbs = batch.column("kb").to_pylist()
        keys = map(key_of, kbs) if keyed else itertools.repeat(None)
    else:
        name = _key_column(batch)
        kbs = _recomputed(name, items)
        keys = (item.get(name) for item in items) if keyed else itertools.repeat(None)
    values = batch.column("sv").to_pylist() if "sv" in names else itertools.repeat(None)
    shards = batch.column("s").to_pylist() if "s" in names else itertools.repeat(None)
    return zip(batch.column("h").to_pylist(), kbs, values, shards, batch.column("pos").to_pylist(), keys, items)


def _recomputed(name: str, items: Sequence[Any]) -> list[bytes]:
    return [key_bytes(item.get(name)) for item in items]


def key_bytes_at(data: pa.Table | pa.RecordBatch, rows: np.ndarray) -> pa.Array:
    """The key bytes (large_binary) of `data`'s rows at `rows`: stored, or recomputed from their payload."""
    indices = pa.array(rows, pa.int64())
    if "kb" in data.schema.names:
        return _array(data.column("kb").take(indices))
    columns, description = payload_columns(data)
    taken = [_array(c.take(indices)) for c in columns]
    return pa.array(_recomputed(_key_column(data), records_of(taken, description)), pa.large_binary())


def _array(column):
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def group_key(data: pa.Table | pa.RecordBatch, row: int, item: Any) -> Any:
    """The key of a group whose first row is `row` of `data`, its payload record `item`."""
    if "kb" in data.schema.names:
        return key_of(data.column("kb")[row].as_py())
    return item.get(_key_column(data))
