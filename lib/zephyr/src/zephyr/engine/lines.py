"""A frame's rows as JSON lines, made natively where that writes what the records read back as.

- A row no op changed is its input line, byte for byte (a dedup or a filter copies its lines).
- Fields `with_columns` added, where no row had them before, are appended to each row's line
  (`,"name":value` before its closing brace), encoded by Polars: for strings, 64-bit integers,
  floats, booleans and nulls Polars writes exactly what orjson writes (checked by the tests).
- A complete frame (Parquet rows, say) of such columns is encoded whole, in record order.
Anything else (a field replaced in place, a `select` of JSON input, lists, structs, bytes, a
column held in Python) returns None, and the caller writes the rows' records with orjson and
the record path's checks (`zephyr.io.jsonl.encode_records`).
"""

from __future__ import annotations

import polars as pl
import pyarrow as pa

from zephyr.engine.frame import Frame
from zephyr.engine.translate import kind_of_dtype

__all__ = ["json_lines"]


def json_lines(frame: Frame) -> pa.Array | None:
    """Each row's JSON line with its newline (a large_binary array), or None (see the module doc)."""
    if frame.untyped:
        return None
    if frame.lines is not None:
        if frame.selected is not None:
            return None
        if not frame.assigned:
            return frame.lines
        return _appended(frame)
    if not frame.complete:
        return None
    names = [n for n in (frame.order if frame.selected is None else frame.selected) if n in frame.df.columns]
    if not names or not _encodable(frame.df, names):
        return None
    encoded = frame.df.select(pl.struct(names).struct.json_encode().alias("j")).get_column("j")
    return _with_newline(encoded)


def _appended(frame: Frame) -> pa.Array | None:
    """Input lines with the new fields added at their end, where no record has them yet."""
    names = list(frame.assigned)
    if not _encodable(frame.df, names):
        return None
    if any(not record or any(n in record for n in names) for record in frame.base):
        return None  # replacing a field in place, or a record with no field to put a comma after
    fields = frame.df.select(pl.struct(names).struct.json_encode().str.slice(1).alias("f")).get_column("f")
    lines = pl.Series("l", frame.lines).cast(pl.String)  # orjson accepted each line: valid UTF-8
    body = lines.str.strip_chars_end(" \t\r\n").str.strip_suffix("}")
    out = pl.select(pl.concat_str([body, pl.lit(","), fields, pl.lit("\n")])).to_series()
    return out.cast(pl.Binary).to_arrow().cast(pa.large_binary())


def _encodable(df: pl.DataFrame, names: list[str]) -> bool:
    """Whether Polars writes these columns as orjson writes their values: scalar kinds, and no
    NaN or infinity (which JSON cannot hold: the record path refuses them, naming the record)."""
    if not all(kind_of_dtype(df.schema[n]) for n in names):
        return False
    floats = [n for n in names if df.schema[n] == pl.Float64]
    return not floats or bool(df.select(pl.all_horizontal(pl.col(floats).is_finite().fill_null(True)).all()).item())


def _with_newline(encoded: pl.Series) -> pa.Array:
    return pl.select(encoded + "\n").to_series().cast(pl.Binary).to_arrow().cast(pa.large_binary())
