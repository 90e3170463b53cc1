"""Keys of the rows of a columnar shuffle batch or run: stored as key bytes, or read from the payload.

For a shuffle keyed by a plain column (`deduplicate(col("text"))`, `group_by(col("k"), ...)`)
neither the map's Arrow buffer nor its runs hold the key bytes `kb`: the key is a field of every
payload row, so it is read back (and its bytes, `zephyr.canonical.key_bytes` of the field, are
what the map side hashed) for the rows that need it: those whose hash equals a neighbour's,
where equal keys must be told from a collision, and a collision's rows, ordered by key bytes.
For an exact dedup the key's text was otherwise held twice, about 40% of a spill's bytes
(benchmarks/README.md, sections 29 and 33); reading keys back costs ~2.5 us a tied row (a
duplicate and its original). The schema's metadata names the field (`KEY_META`); batches of
any other key keep `kb`.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc

from zephyr.canonical import key_bytes
from zephyr.expr.key import is_column_key
from zephyr.shuffle.columnar import key_of, payload_columns, records_of

__all__ = ["KEY_META", "batch_rows", "column_of_key", "group_key", "key_bytes_at", "keys_equal"]

KEY_META = b"zephyr.key_column"


def column_of_key(key: Any) -> str | None:
    """The payload field a shuffle key reads (a plain column key), or None (a Python key function:
    its runs keep `kb`)."""
    return key.expr.name if is_column_key(key) else None


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
        kbs = [key_bytes(item.get(name)) for item in items]
        keys = (item.get(name) for item in items) if keyed else itertools.repeat(None)
    values = batch.column("sv").to_pylist() if "sv" in names else itertools.repeat(None)
    shards = batch.column("s").to_pylist() if "s" in names else itertools.repeat(None)
    return zip(batch.column("h").to_pylist(), kbs, values, shards, batch.column("pos").to_pylist(), keys, items)


def key_bytes_at(data: pa.Table | pa.RecordBatch, rows: np.ndarray) -> pa.Array:
    """The key bytes (large_binary) of `data`'s rows at `rows`: stored, or recomputed from their payload."""
    if "kb" in data.schema.names:
        return _array(data.column("kb").take(pa.array(rows, pa.int64())))
    return _binary(list(map(key_bytes, _key_values(data, rows))))


def keys_equal(data: pa.Table | pa.RecordBatch, left: np.ndarray, right: np.ndarray) -> np.ndarray:
    """Per pair of rows `left[i]`, `right[i]` of `data`: are their keys equal? By the stored key
    bytes, or by the keys read back from the payload (each row once): a run's keys are all `str`
    or all 64-bit `int` (`columnar.key_column`), whose key bytes are equal just when their
    types and values are."""
    if "kb" in data.schema.names:
        kb = data.column("kb")
        return pc.equal(kb.take(pa.array(left)), kb.take(pa.array(right))).to_numpy(zero_copy_only=False)
    rows = np.union1d(left, right)
    values = _key_values(data, rows)
    pairs = zip(np.searchsorted(rows, left).tolist(), np.searchsorted(rows, right).tolist())
    return np.fromiter((type(values[a]) is type(values[b]) and values[a] == values[b] for a, b in pairs),
                       dtype=bool, count=len(left))


def _key_values(data: pa.Table | pa.RecordBatch, rows: np.ndarray) -> list:
    """The keys of `data`'s rows at `rows`, read from their payload (the field the schema names)."""
    indices = pa.array(rows, pa.int64())
    columns, description = payload_columns(data)
    taken = [_array(c.take(indices)) for c in columns]
    if description.get("json"):  # orjson reads a str or 64-bit int key exactly (`json_values` is for big ints elsewhere)
        items = map(orjson.loads, taken[0].to_pylist())
    else:
        items = records_of(taken, description)
    name = _key_column(data)
    return [item.get(name) for item in items]


def _binary(values: list[bytes]) -> pa.Array:
    """A large_binary array of `values`, built from one joined buffer."""
    offsets = np.zeros(len(values) + 1, dtype=np.int64)
    np.cumsum(np.fromiter(map(len, values), dtype=np.int64, count=len(values)), out=offsets[1:])
    return pa.Array.from_buffers(pa.large_binary(), len(values), [None, pa.py_buffer(offsets), pa.py_buffer(b"".join(values))])


def _array(column):
    return column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column


def group_key(data: pa.Table | pa.RecordBatch, row: int, item: Any) -> Any:
    """The key of a group whose first row is `row` of `data`, its payload record `item`."""
    if "kb" in data.schema.names:
        return key_of(data.column("kb")[row].as_py())
    return item.get(_key_column(data))
