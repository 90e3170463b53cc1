"""Arrow tables as JSON lines, byte for byte what `orjson.dumps(record)` writes for the records
`table.to_pylist()` gives, for the column types where that can be done in Arrow.

Written in Arrow: strings (escaped as orjson escapes them: `"`, `\\` and the control
characters, nothing else), integers, booleans and all-null columns, any of them with nulls.
Any other type (floats, whose shortest text Arrow does not write as orjson does; lists;
structs; timestamps) gives None: the caller writes those rows as records instead.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import orjson
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.types as pt

__all__ = ["as_string", "json_lines_of", "same_bytes"]

# what orjson writes for each character it escapes
_CONTROLS = [(chr(c), orjson.dumps(chr(c))[1:-1].decode()) for c in range(32)]
_NEEDS_ESCAPE = r'["\\\x00-\x1f]'
_HAS_CONTROL = r"[\x00-\x1f]"


def json_lines_of(table: pa.Table, plain: bool = False) -> pa.Array | None:
    """Each row's JSON line (with its newline) as a large_binary array, or None when a column's
    type is not written here. `plain`: the strings are known to hold nothing to escape."""
    names = table.column_names
    if not names or len(set(names)) != len(names):
        return None
    # one join over the whole line: the quotes of a string column without nulls go into the
    # literal parts around it (a join per column costs a copy of every value per column)
    parts: list[Any] = []
    literal = ""
    for i, (name, column) in enumerate(zip(names, table.columns)):
        literal += ("{" if i == 0 else ",") + orjson.dumps(name).decode() + ":"
        column = as_string(_one_chunk(column))
        if column is None:
            return None
        if _is_string(column.type) and not column.null_count:
            parts += [literal + '"', column if plain else _escaped(column)]
            literal = '"'
            continue
        values = _json_values(column, plain)
        if values is None:
            return None
        parts += [literal, values]
        literal = ""
    parts.append(literal + "}\n")
    lines = pc.binary_join_element_wise(*parts, "")
    return lines.cast(pa.large_binary())


def as_string(column: pa.Array) -> pa.Array | None:
    """A large_string column as a string one (the join's literal parts are strings, and it has
    no kernel mixing the two); None when it holds too much for 32-bit offsets."""
    if not pt.is_large_string(column.type):
        return column
    try:
        return column.cast(pa.string())
    except (pa.ArrowInvalid, pa.ArrowCapacityError):
        return None


def _is_string(kind: pa.DataType) -> bool:
    return pt.is_string(kind) or pt.is_large_string(kind)


def _json_values(column: pa.Array, plain: bool) -> pa.Array | None:
    kind = column.type
    if _is_string(kind):
        text = column if plain else _escaped(column)
        values = pc.binary_join_element_wise('"', text, '"', "")
    elif pt.is_integer(kind):
        values = column.cast(pa.string())
    elif pt.is_boolean(kind):
        values = pc.if_else(column, "true", "false")
    elif pt.is_null(kind):
        values = pa.nulls(len(column), pa.string())
    else:
        return None
    return values.fill_null("null") if values.null_count else values


def _escaped(column: pa.Array) -> pa.Array:
    if not len(column) or not pc.any(pc.match_substring_regex(column, _NEEDS_ESCAPE)).as_py():
        return column
    column = pc.replace_substring(column, "\\", "\\\\")
    column = pc.replace_substring(column, '"', '\\"')
    if pc.any(pc.match_substring_regex(column, _HAS_CONTROL)).as_py():
        for char, escape in _CONTROLS:
            column = pc.replace_substring(column, char, escape)
    return column


def _one_chunk(column):
    if isinstance(column, pa.ChunkedArray):
        return column.chunk(0) if column.num_chunks == 1 else column.combine_chunks()
    return column


def same_bytes(lines: pa.Array, data: bytes) -> bool:
    """Whether a large_binary array's rows, back to back, are exactly `data`."""
    _, offsets, buffer = lines.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64, count=lines.offset + len(lines) + 1)
    start, end = int(bounds[lines.offset]), int(bounds[-1])
    return end - start == len(data) and buffer.slice(start, end - start).equals(pa.py_buffer(data))
