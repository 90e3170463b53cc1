"""Shuffle keys of a frame: the key bytes and hashes the record path computes (`shuffle.keys`),
made from a typed column (so rows land in the same partitions, in the same order)."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa

from zephyr.engine.frame import Frame
from zephyr.expr.key import is_column_key
from zephyr.shuffle.keys import key_column_of

__all__ = ["frame_keys"]

# `key_bytes` tags: b"s" + UTF-8 for a str, b"j" + its JSON (the decimal digits) for an int
_TAGS = {pl.String: "s", pl.Int64: "j"}


def frame_keys(frame: Frame, key) -> tuple[pa.Array, np.ndarray] | None:
    """(key bytes as a large_binary array, hashes) of a column key, or None where the record
    path would not use the columnar form either (nulls, other types) or the key is not a
    plain column the frame holds typed."""
    if not is_column_key(key) or key.expr.name not in frame.df.columns:
        return None
    if frame.selected is not None and key.expr.name not in frame.selected:
        return None
    column = frame.df.get_column(key.expr.name)
    tag = _TAGS.get(column.dtype)
    if tag is None or column.null_count():
        return None
    return key_column_of(pl.select(pl.concat_str([pl.lit(tag), column.cast(pl.String)]).cast(pl.Binary)).to_series())
