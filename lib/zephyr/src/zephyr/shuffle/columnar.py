"""Records <-> Arrow columns for the shuffle, exactly or not at all.

Two payload forms, tried in this order:

**JSON lines** (`json_lines`). When every record is JSON data built only from plain `dict`
(with `str` keys), `list`, `str`, `int` (at most 64 bits), finite `float`, `bool` and `None`
(what `load_jsonl` produces, and most records built from it), the payload is one binary column
holding each record's `orjson.dumps(record) + b"\n"`: decoding gives back an equal record of
identical types (orjson writes every float so that it parses back to the same bits, and keeps
key order), and a JSONL writer after the shuffle copies the bytes as they are
(`json_records.JsonLines`). Anything else (a tuple, which would come back a list; `NaN`, which
would come back `None`; subclasses; bytes) is checked for and rejected, exactly.

**Fields** (`columns_of`). A batch converts when every record is a plain `dict` with the same
`str` keys in the same order (what `load_parquet` produces). Each field becomes one column:

- values that are all `str`, all `int` (64-bit), all `float` or all `bool`, each optionally
  mixed with `None`, become a native Arrow column (`None` is null; `NaN` and `-0.0` survive);
- anything else (lists, nested dicts, tuples, bytes, `int` mixed with `float`, subclasses such
  as enums or `OrderedDict`, integers beyond 64 bits) becomes a column of per-value pickles.

Types are checked exactly (`type(v) is int`), so nothing is ever coerced: `1` stays an `int`
and `1.0` a `float`, a tuple stays a tuple, a dict keeps its key order. Records that are not
such dicts return None and travel pickled. Keys convert when all are `str` or all 64-bit `int`.
Reading back gives equal records of identical types, in the same key order.
"""

from __future__ import annotations

import collections
import itertools
import pickle
from collections.abc import Iterator, Sequence
from typing import Any

import cloudpickle
import numpy as np
import orjson
import polars as pl
import pyarrow as pa

from zephyr.switches import switched_on
from zephyr.io.json_records import json_exact
from zephyr.io.jsonl import json_values
from zephyr.shuffle.keys import key_column_of

__all__ = [
    "batch_rows", "columns_of", "conform", "dumps", "is_json", "json_lines", "key_column", "key_of", "payload_columns", "payload_of",
    "json_exact", "payload_names", "records_of", "sort_value_column", "unify_schemas",
]

FIELDS_META = b"zephyr.fields"
JSON_COLUMN = "j"
JSON_DESCRIPTION = {"json": True}
_NO_DEFAULT = itertools.repeat(None)
_LINE_OPTION = itertools.repeat(orjson.OPT_APPEND_NEWLINE)
_NATIVE = {str: pa.large_string(), int: pa.int64(), float: pa.float64(), bool: pa.bool_()}
_PICKLE = "p"
_NATIVE_TAG = "n"


def dumps(obj: Any) -> bytes:
    """pickle, or cloudpickle for classes defined in `__main__` or dynamically."""
    try:
        return pickle.dumps(obj, protocol=5)
    except Exception:
        return cloudpickle.dumps(obj, protocol=5)


def _column(values: list) -> tuple[pa.Array, str]:
    types = set(map(type, values))
    types.discard(type(None))
    if not types:
        return pa.nulls(len(values)), _NATIVE_TAG
    if len(types) == 1:
        arrow_type = _NATIVE.get(types.pop())
        if arrow_type is not None:
            try:
                return pa.array(values, arrow_type), _NATIVE_TAG
            except (OverflowError, UnicodeEncodeError, pa.ArrowException):
                pass  # integers beyond 64 bits, strings with lone surrogates
    return pa.array([dumps(v) for v in values], pa.large_binary()), _PICKLE


def json_enabled() -> bool:
    """`ZEPHYR_SHUFFLE_JSON=0` turns the JSON-lines payload off (records then travel as fields)."""
    return switched_on("ZEPHYR_SHUFFLE_JSON")


def json_lines(items: Sequence[Any], checked: bool = True) -> pa.Array | None:
    """Each item's JSON line (`orjson.dumps(item) + b"\n"`) as a binary column, or None unless
    every item decodes back from its line equal and of identical types (`checked=False`
    skips that check, for items a JSON parser made).

    The lines are appended to one buffer as they are made and the row bounds found from its
    newlines (orjson escapes any newline inside a string): holding each line as its own bytes
    object costs several times more, since orjson sizes every output for 1 KiB and more first.
    """
    buffer = bytearray()
    try:
        collections.deque(map(buffer.extend, map(orjson.dumps, items, _NO_DEFAULT, _LINE_OPTION)), maxlen=0)
    except orjson.JSONEncodeError:  # beyond 64 bits, lone surrogates, cycles, unknown types
        return None
    if checked and not json_exact(items):
        return None
    ends = np.flatnonzero(np.frombuffer(buffer, dtype=np.uint8) == 10)
    offsets = np.zeros(len(ends) + 1, dtype=np.int64)
    offsets[1:] = ends + 1
    return pa.Array.from_buffers(pa.large_binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(buffer)])


def is_json(schema: pa.Schema) -> bool:
    """Whether a shuffle batch's payload is JSON lines (one `j` column)."""
    return JSON_COLUMN in schema.names


def payload_of(items: Sequence[Any], parsed_json: bool = False, fields_only: bool = False) -> tuple[list[pa.Array], list[str], dict] | None:
    """`items` as payload columns, with their names and description: JSON lines when they are
    exact (known to be when `parsed_json`: they are what a JSON parser made), else fields; None
    when neither converts (they travel pickled). `fields_only` skips JSON lines (for a buffer
    that already holds fields, which JSON batches could not join)."""
    if json_enabled() and not fields_only:
        lines = json_lines(items, checked=not parsed_json)
        if lines is not None:
            return [lines], [JSON_COLUMN], JSON_DESCRIPTION
    fields = columns_of(items)
    if fields is None:
        return None
    columns, description = fields
    return columns, [f"c{i}" for i in range(len(columns))], description


def columns_of(items: Sequence[Any]) -> tuple[list[pa.Array], dict] | None:
    """Payload columns of `items` and their description, or None when they are not uniform dicts."""
    first = items[0]
    if type(first) is not dict:
        return None
    names = tuple(first)
    if not names or not all(map(_utf8, names)):
        return None  # empty dicts (no column to count rows), or names the description cannot hold
    if set(map(type, items)) != {dict} or set(map(tuple, items)) != {names}:
        return None
    columns, encodings = [], []
    for name in names:
        column, encoding = _column([item[name] for item in items])
        columns.append(column)
        encodings.append(encoding)
    return columns, {"names": list(names), "encodings": encodings}


def _utf8(name: Any) -> bool:
    """A str that encodes as UTF-8 (not one with a lone surrogate, which pickle carries)."""
    if type(name) is not str:
        return False
    if name.isascii():
        return True
    try:
        name.encode()
    except UnicodeEncodeError:
        return False
    return True


def payload_columns(data: pa.Table | pa.RecordBatch) -> tuple[list, dict]:
    """A shuffle table's (or batch's) payload columns and their description."""
    description = orjson.loads(data.schema.metadata[FIELDS_META])
    return [data.column(name) for name in _payload_names(description)], description


def payload_names(schema: pa.Schema) -> list[str]:
    """A shuffle table's payload column names (what `payload_columns` reads)."""
    return _payload_names(orjson.loads(schema.metadata[FIELDS_META]))


def _payload_names(description: dict) -> list[str]:
    return [JSON_COLUMN] if description.get("json") else [f"c{i}" for i in range(len(description["names"]))]


def records_of(columns: Sequence[pa.Array], description: dict) -> list:
    """The records back from payload columns: equal values, identical types, same key order."""
    if description.get("json"):
        return json_values(columns[0].to_pylist())
    names, encodings = description["names"], description["encodings"]
    if _PICKLE not in encodings:
        return pa.StructArray.from_arrays(list(columns), names=names).to_pylist()
    values = [
        [pickle.loads(b) for b in column.to_pylist()] if encoding == _PICKLE else column.to_pylist()
        for column, encoding in zip(columns, encodings)
    ]
    return [dict(zip(names, row)) for row in zip(*values)]


def key_column(keys: Sequence[Any]) -> tuple[pa.Array, np.ndarray] | None:
    """Canonical key bytes (`key_bytes`) as an Arrow column, and their hashes; None unless the
    keys are all `str` or all 64-bit `int` (the kinds whose bytes decode back exactly)."""
    types = set(map(type, keys))
    if types == {str}:
        try:
            kbs = [b"s" + k.encode() for k in keys]
        except UnicodeEncodeError:
            return None
    elif types == {int} and -(1 << 63) <= min(keys) and max(keys) < (1 << 63):
        kbs = [b"j%d" % k for k in keys]
    else:
        return None
    return key_column_of(pl.Series(kbs, dtype=pl.Binary))


def key_of(kb: bytes) -> Any:
    """The key a columnar run's key bytes stand for (a `str` or an `int`, see `key_column`)."""
    return kb[1:].decode() if kb[:1] == b"s" else orjson.loads(kb[1:])


def sort_value_column(values: Sequence[Any]) -> pa.Array | None:
    """`sort_by` values as a column that sorts as Python would: all `int` (64-bit), all
    `float` without NaN, or all `str`. None otherwise."""
    types = set(map(type, values))
    if len(types) != 1:
        return None
    kind = types.pop()
    if kind not in (int, float, str):
        return None
    try:
        column = pa.array(values, _NATIVE[kind])
    except (OverflowError, UnicodeEncodeError, pa.ArrowException):
        return None
    if kind is float and np.isnan(column.to_numpy(zero_copy_only=False)).any():
        return None
    return column


def unify_schemas(a: pa.Schema, b: pa.Schema) -> pa.Schema | None:
    """A schema both conform to when they differ only by all-null columns (null widens to the
    other's type); None when they truly differ (the caller falls back to pickles)."""
    if a.equals(b, check_metadata=True):
        return a
    if a.names != b.names or a.metadata != b.metadata:
        return None
    fields = []
    for x, y in zip(a, b):
        if x.type == y.type or y.type == pa.null():
            fields.append(x)
        elif x.type == pa.null():
            fields.append(y)
        else:
            return None
    return pa.schema(fields, metadata=a.metadata)


def conform(batch: pa.RecordBatch, schema: pa.Schema) -> pa.RecordBatch:
    """Cast a batch's all-null columns to `schema`'s (after `unify_schemas` widened it)."""
    if batch.schema.equals(schema, check_metadata=True):
        return batch
    columns = [c if c.type == f.type else pa.nulls(len(c), f.type) for c, f in zip(batch.columns, schema)]
    return pa.RecordBatch.from_arrays(columns, schema=schema)


def batch_rows(batch: pa.RecordBatch, keyed: bool) -> Iterator[tuple]:
    """`(h, kb, sort value, origin shard, pos, key, item)` per row of a shuffle batch (key None
    unless keyed; the shard None unless the batch has a column of them, `zephyr.shuffle.origin`)."""
    items = records_of(*payload_columns(batch))
    kbs = batch.column("kb").to_pylist()
    names = batch.schema.names
    values = batch.column("sv").to_pylist() if "sv" in names else itertools.repeat(None)
    shards = batch.column("s").to_pylist() if "s" in names else itertools.repeat(None)
    keys = map(key_of, kbs) if keyed else itertools.repeat(None)
    return zip(batch.column("h").to_pylist(), kbs, values, shards, batch.column("pos").to_pylist(), keys, items)
