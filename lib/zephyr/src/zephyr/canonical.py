"""Canonical bytes of a value: equal values, equal bytes, in any process and on any machine.

The shuffle keys records by these bytes (`zephyr.shuffle.keys`) and `col(...).hash()` hashes
them (`zephyr.expr`), so both say the same thing about which values are equal.
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import struct
from typing import Any

import orjson

__all__ = ["key_bytes"]

_STR_TAG = b"s"


def key_bytes(key: Any) -> bytes:
    """A canonical, process-independent encoding of a key: equal keys, equal bytes, and only they.

    A `str` is `b"s"` + its UTF-8; a value made only of `dict` (with `str` keys), `list`, `str`,
    64-bit `int`, finite `float`, `bool` and `None` is `b"j"` + JSON with sorted keys; anything
    else is `b"c"` + `_canonical_bytes`. Keys are equal when they have the same types and values:
    `1`, `1.0` and `True` differ, a tuple is not a list, NaN equals NaN, `0.0` and `-0.0` differ;
    dict and set order do not count. (JSON alone confused None with NaN and the infinities, tuples
    with lists, `{1: x}` with `{"1": x}` and dataclasses with dicts.)
    """
    if type(key) is str:
        try:
            return _STR_TAG + key.encode()
        except UnicodeEncodeError:  # lone surrogates: the generic encoding below keeps them
            pass
    if _json_exact(key):
        try:
            return b"j" + orjson.dumps(key, option=orjson.OPT_SORT_KEYS)
        except orjson.JSONEncodeError:  # a lone surrogate in a nested str
            pass
    out = bytearray(b"c")
    _canonical_bytes(key, out)
    return bytes(out)


def _json_exact(value: Any) -> bool:
    """Whether JSON writes `value` so that no other value has the same text."""
    t = type(value)
    if t is str or t is bool or value is None:
        return True
    if t is int:
        return -(1 << 63) <= value < (1 << 64)
    if t is float:
        return math.isfinite(value)
    if t is list:
        return all(map(_json_exact, value))
    if t is dict:
        return all(type(k) is str for k in value) and all(map(_json_exact, value.values()))
    return False


def _canonical_bytes(value: Any, out: bytearray) -> None:
    """A tagged, length-prefixed encoding that depends only on types and values (never on object
    identity, as a pickle's memo does, nor on dict or set order)."""
    t = type(value)
    if value is None or t is bool:
        out += b"N" if value is None else b"T" if value else b"F"
    elif t is int:
        _chunk(out, b"i", str(value).encode())
    elif t is float:
        out += b"fnan" if value != value else b"f" + struct.pack(">d", value)
    elif t is str:
        _chunk(out, b"s", value.encode("utf-8", "surrogatepass"))
    elif t is bytes:
        _chunk(out, b"b", value)
    elif t in (list, tuple):
        out += b"[%d:" % len(value) if t is list else b"(%d:" % len(value)
        for v in value:
            _canonical_bytes(v, out)
    elif t is dict or t in (set, frozenset):
        pairs = value.items() if t is dict else ((v,) for v in value)
        encoded = sorted(_encode_all(pair) for pair in pairs)
        out += b"{" if t is dict else b"<" if t is set else b">"
        out += b"%d:" % len(encoded) + b"".join(_length_prefixed(e) for e in encoded)
    elif dataclasses.is_dataclass(value):
        _chunk(out, b"D", f"{t.__module__}.{t.__qualname__}".encode())
        _canonical_bytes(tuple(getattr(value, f.name) for f in dataclasses.fields(value)), out)
    elif isinstance(value, tuple) and hasattr(t, "_fields"):  # a namedtuple: a set in it pickles in hash order
        _chunk(out, b"n", f"{t.__module__}.{t.__qualname__}".encode())
        _canonical_bytes(tuple(value), out)
    else:
        _chunk(out, b"p", _pickle_by_value(value))


def _pickle_by_value(value: Any) -> bytes:
    """A pickle without the memo: an ordinary pickle writes a second reference to the same
    object (a str in both fields of a namedtuple) as a back-reference, so equal keys built from
    shared or separate objects got different bytes and split into two groups."""
    buffer = io.BytesIO()
    pickler = pickle.Pickler(buffer, protocol=5)
    pickler.fast = True  # no memo, hence no identity
    try:
        pickler.dump(value)
    except ValueError:  # a cyclic value needs the memo
        return pickle.dumps(value, protocol=5)
    return buffer.getvalue()


def _encode_all(values: tuple) -> bytes:
    out = bytearray()
    for v in values:
        _canonical_bytes(v, out)
    return bytes(out)


def _length_prefixed(data: bytes) -> bytes:
    return b"%d:" % len(data) + data


def _chunk(out: bytearray, tag: bytes, data: bytes) -> None:
    out += tag + _length_prefixed(data)
