"""Shuffle keys of Arrow rows: the same key bytes and hashes `columnar.key_column` gives the
record path, computed from a column (so rows land in the same partitions, in the same order)."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

from zephyr.expr.key import ExprKey
from zephyr.io.arrow_json import as_string
from zephyr.expr.nodes import Column
from zephyr.shuffle.keys import hash_key_array

__all__ = ["arrow_key_column", "is_column_key"]


def is_column_key(key) -> bool:
    return isinstance(key, ExprKey) and isinstance(key.expr, Column)


def arrow_key_column(table: pa.Table, key) -> tuple[pa.Array, np.ndarray] | None:
    """(key bytes, hashes) of a column key, or None where the record path would not use the
    columnar form either (nulls, other types) or the key is not a plain column."""
    if not is_column_key(key) or key.expr.name not in table.column_names:
        return None
    column = table.column(key.expr.name)
    if column.null_count:
        return None
    kind = column.type
    if pt.is_string(kind) or pt.is_large_string(kind):
        column = as_string(column.combine_chunks())  # the join has no kernel for large_string with str literals
        if column is None:
            return None
        kb = pc.binary_join_element_wise("s", column, "")  # b"s" + UTF-8, as key_bytes writes a str
    elif pt.is_signed_integer(kind):
        kb = pc.binary_join_element_wise("j", column.cast(pa.string()), "")  # b"j" + decimal
    else:
        return None
    kb = kb.combine_chunks() if isinstance(kb, pa.ChunkedArray) else kb
    kb = kb.cast(pa.large_binary())
    return kb, hash_key_array(kb)
