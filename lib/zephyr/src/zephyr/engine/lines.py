"""A frame's rows as JSON lines, made natively where that writes what the records read back as.

- A row no op changed is its input line, byte for byte (a dedup or a filter copies its lines).
- A complete frame (Parquet rows, say) of strings, integers, 64-bit floats, booleans and nulls is
  encoded whole by Polars, in record order: for those Polars writes exactly what orjson writes
  (checked by the tests).
Anything else (JSON rows `with_columns` or `select` changed, lists, structs, bytes, a column held
in Python) returns None, and the caller writes the rows' records with orjson and the record
path's checks (`zephyr.io.jsonl.encode_records`). (Appending a new field to each changed line in
Polars was measured and dropped: six passes over the text cost more than orjson re-encoding the
records the scan already parsed, 0.15-0.35 against 0.10-0.14 CPU s for 60,000 1.2 KB rows.)
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from zephyr.engine.frame import Frame
from zephyr.engine.translate import kind_of_dtype

__all__ = ["json_lines"]


def json_lines(frame: Frame) -> pa.Array | None:
    """Each row's JSON line with its newline (a large_binary array), or None (see the module doc)."""
    if frame.lines is not None:  # a field held in Python does not matter to a row no op changed
        return frame.lines if frame.selected is None and not frame.assigned else None
    if not frame.complete or frame.untyped:
        return None
    names = [n for n in (frame.order if frame.selected is None else frame.selected) if n in frame.df.columns]
    if not names or not _encodable(frame.df, names):
        return None
    encoded = frame.df.select(pl.struct(names).struct.json_encode().alias("j")).get_column("j")
    return _with_newline(encoded)


def _encodable(df: pl.DataFrame, names: list[str]) -> bool:
    """Whether Polars writes these columns as orjson writes their values: scalar kinds, and no
    NaN or infinity (which JSON cannot hold: the record path refuses them, naming the record)."""
    if not all(kind_of_dtype(df.schema[n]) for n in names):
        return False
    floats = [n for n in names if df.schema[n] == pl.Float64]
    return not floats or bool(df.select(pl.all_horizontal(pl.col(floats).is_finite().fill_null(True)).all()).item())


def _with_newline(encoded: pl.Series) -> pa.Array:
    return pl.select(encoded + "\n").to_series().cast(pl.Binary).to_arrow().cast(pa.large_binary())
