"""The columns a stage needs from a block of JSON lines, read natively and exactly, or a reason not.

Arrow's JSON reader with an explicit schema reads only the named fields (measured on the dedup
corpus: 1.6-2x less CPU than orjson parsing every line into dicts and building the column,
checks included; section 28 of benchmarks/README.md). With a schema it is strict where the record path's parser (orjson)
is: it refuses a value of another type than its column's, a key given twice, a lone surrogate
escape, an integer beyond 64 bits in an integer column, a number beyond a double, and any syntax
error. (Polars' reader is a little cheaper but silently turns `1` into "1" in a string column, a lone
surrogate into NUL, and keeps the first of two keys where orjson keeps the last.)

Where Arrow's reader is lenient, the checks here cover it: a line must start with "{" (Arrow
reads `null` as a null row, and crashes on one as the first line) and end with "}" (else a line
cut short and a line of two objects give one row a line, misplaced), a block must be valid UTF-8
(Arrow does not check fields it skips), a line holding `NaN`/`Inf`/`Infinity` where a value may
start, nesting deeper than orjson allows or an integer of 309 digits or more (beyond a double:
orjson refuses it) is checked by orjson, one line must give one row, and a line whose value in a
float column is integral is read by orjson, which must give that float (Arrow reads the integer
`1` as 1.0 where orjson gives an int, and `1.8e308` as infinity where orjson refuses it). A column's type comes from the
block before or, where that held no value of it, from the block's first lines by orjson; a
column holding nested values or integers beyond 64 bits is not read here.

`read_columns` returns the reason where any of this fails; the caller then parses the block
with orjson (today's path, whose errors name the file and line) and says so.
"""

from __future__ import annotations

import json

import numpy as np
import orjson
import polars as pl
import pyarrow as pa
import pyarrow.json as pa_json

__all__ = ["arrow_types", "read_columns"]

_KINDS = {str: pa.string(), float: pa.float64(), bool: pa.bool_()}
_ARROW_OF_POLARS = {pl.String: pa.string(), pl.Int64: pa.int64(), pl.Float64: pa.float64(), pl.Boolean: pa.bool_()}
_NON_JSON = (b"NaN", b"Inf")  # Arrow's reader takes NaN, Inf, Infinity (and -); orjson (and JSON) refuse them
_BETWEEN = np.frombuffer(b" \t\r-", dtype=np.uint8)  # what may stand between ":" and a bare NaN
_BARE_AFTER = np.frombuffer(b":,[ \t\r-", dtype=np.uint8)  # a walk back that ends on one of _BETWEEN went too far
_SPACE_RUN = 64  # bytes walked back from a word at most
_MAX_DEPTH = 1024  # orjson refuses deeper nesting; Arrow's reader does not
_LONG_INTEGER = 309  # digits of an integer orjson reads as a float beyond a double (and refuses); Arrow skips it
_STRIDE = _LONG_INTEGER // 2 - 1  # a run of _LONG_INTEGER digits holds two sampled bytes this far apart
_TYPE_LINES = 16  # lines read by orjson to find the type of a column the block before did not give
_INT64 = 2**63


def read_columns(block: bytes, starts: np.ndarray, names: list[str], types: dict) -> pl.DataFrame | str:
    """The `names` columns of `block` (whole lines, each ending in a newline, no whitespace
    around a line's JSON; `starts`: the first byte of each) as one row a line, each exactly what orjson gives (null where a line lacks
    the field), or why not. `types`: name -> Arrow type the block before held (updated)."""
    reason = _lenient_input(block, starts) or _find_types(block, starts, names, types)
    if reason:
        return reason
    schema = pa.schema([(name, types[name]) for name in names])
    try:
        table = pa_json.read_json(
            pa.BufferReader(block),
            read_options=pa_json.ReadOptions(use_threads=False, block_size=max(len(block) + 1, 1 << 16)),
            parse_options=pa_json.ParseOptions(explicit_schema=schema, unexpected_field_behavior="ignore"),
        )
    except (pa.ArrowException, UnicodeDecodeError) as e:
        return f"Arrow's JSON reader refused it ({str(e).splitlines()[0][:160]})"
    if table.num_rows != len(starts):
        return f"{table.num_rows} rows from {len(starts)} lines (several JSON documents on a line)"
    df = pl.from_arrow(table) if names else pl.DataFrame()
    df.columns = names  # Polars names a column "" "column_0"
    return _floats_unlike_orjson(df, block, starts) or df


def arrow_types(df: pl.DataFrame, untyped: dict, types: dict) -> None:
    """Note in `types` the Arrow type of each column of `df` holding a value (for the next block)."""
    for name, dtype in df.schema.items():
        if dtype in _ARROW_OF_POLARS:
            types[name] = _ARROW_OF_POLARS[dtype]
        elif types.get(name) == pa.null():  # no value seen yet: the next block looks again
            del types[name]
    for name in untyped:
        types.pop(name, None)


def _lenient_input(block: bytes, starts: np.ndarray) -> str | None:
    """Why Arrow's reader may take what orjson refuses in `block`, if it may."""
    data = np.frombuffer(block, dtype=np.uint8)
    if len(starts) and not (data[starts] == ord("{")).all():
        return "a line that does not start with '{' (not a JSON object)"
    ends = np.append(starts[1:], len(block))
    if not (data[ends - 2] == ord("}")).all():  # the byte before each newline
        return "a line that does not end with '}' (cut short, or not one JSON object)"
    try:
        block.decode("utf-8")
    except UnicodeDecodeError as e:
        return f"invalid UTF-8 at byte {e.start} of the block"
    suspects = {int(i) for i in np.flatnonzero(ends - starts > 2 * _MAX_DEPTH)
                if block.count(b"[", starts[i], ends[i]) + block.count(b"{", starts[i], ends[i]) > _MAX_DEPTH}
    suspects.update((np.searchsorted(starts, _bare_words(block, data), "right") - 1).tolist())
    digit = (data[::_STRIDE] - np.uint8(48)) < 10  # bytes below "0" wrap past 9
    runs = np.flatnonzero(digit[:-1] & digit[1:]) * _STRIDE
    suspects.update((np.searchsorted(starts, runs, "right") - 1).tolist())
    for i in sorted(suspects):
        try:
            orjson.loads(block[starts[i] : ends[i]])
        except orjson.JSONDecodeError:
            return "a line orjson refuses (NaN, Infinity, deep nesting or an integer beyond a double)"
    return None


def _bare_words(block: bytes, data: np.ndarray) -> np.ndarray:
    """Where a word of `_NON_JSON` may start a bare value: after ":", "," or "[", whitespace or
    "-" between (or after more than `_SPACE_RUN` of those). Elsewhere it lies inside a string,
    where Arrow reads it as orjson does. (NumPy, not a loop per word: prose says "Information".)"""
    found = [word for word in _NON_JSON if word in block]
    if not found:
        return np.zeros(0, dtype=np.int64)
    at = np.flatnonzero(np.logical_or.reduce([(data[:-2] == w[0]) & (data[1:-1] == w[1]) & (data[2:] == w[2]) for w in found]))
    before = at - 1  # a line starts with "{": the walk back stops in it
    for _ in range(_SPACE_RUN):
        moving = np.isin(data[before], _BETWEEN)
        if not moving.any():
            break
        before -= moving
    return at[np.isin(data[before], _BARE_AFTER)]


def _find_types(block: bytes, starts: np.ndarray, names: list[str], types: dict) -> str | None:
    """Fill `types` for `names` the block before did not type, from the first lines by orjson."""
    unknown = [name for name in names if name not in types]
    ends = np.append(starts[1:], len(block))
    for i in range(min(len(starts), _TYPE_LINES)):
        if not unknown:
            break
        try:
            record = orjson.loads(block[starts[i] : ends[i]])
        except orjson.JSONDecodeError:
            return "a line orjson refuses"
        for name in list(unknown):
            value = record.get(name) if type(record) is dict else None
            if value is None:
                continue
            kind = type(value)
            if kind is int and -_INT64 <= value < _INT64:
                types[name] = pa.int64()
            elif kind in _KINDS:
                types[name] = _KINDS[kind]
            else:
                return f"column {name!r} holds {kind.__name__} values (nested or beyond 64 bits)"
            unknown.remove(name)
    types.update((name, pa.null()) for name in unknown)  # none seen yet: a value in a later line refuses
    return None


def _floats_unlike_orjson(df: pl.DataFrame, block: bytes, starts: np.ndarray) -> str | None:
    """Why a float column may hold what orjson reads otherwise, if it may: Arrow reads `1` as
    1.0 and `1.8e308` as infinity (orjson refuses it), so each line whose value there is integral
    (`1.0`, `1e5`, `-0.0`, `1`, or infinity) is read by orjson, which must give that float."""
    ends = np.append(starts[1:], len(block))
    for name, dtype in df.schema.items():
        if dtype != pl.Float64:
            continue
        values = df.get_column(name).to_numpy()  # a null is NaN here
        for i in np.flatnonzero(values == np.floor(values)).tolist():
            line = block[starts[i] : ends[i]]
            try:
                value = orjson.loads(line)[name]
                if abs(values[i]) >= _INT64:  # orjson reads an integer beyond 64 bits as a float; the record path, exactly
                    value = json.loads(line)[name]
            except ValueError:
                return "a line orjson refuses"
            if type(value) is not float or value.hex() != float(values[i]).hex():
                return f"float column {name!r} holds an integral value orjson reads as an int (Arrow: a float)"
    return None
