"""Shuffle keys: a canonical byte encoding, and a 64-bit hash computed a batch at a time.

Every shuffled record carries `kb`, the canonical bytes of its key (equal keys, equal bytes, in
any process), and `h`, a 64-bit hash of `kb`. The partition is `h % num_partitions`; inside a
partition records are ordered by `(h, kb, sort value, origin)`, so equal keys are
adjacent and a partition can be cut into key ranges at any `h` boundary without splitting a key.
`h` only spreads and orders records: equality is always decided on `kb`.

The hash is CRC-32 of `kb` (with its length) through the splitmix64 finalizer: the CRC is one
C call per key (`map(zlib.crc32, ...)`), the mixing is vectorized in NumPy, and both are the
same in every process and on every machine (unlike Python's salted `hash`).
"""

from __future__ import annotations

import dataclasses
import io
import math
import pickle
import struct
import zlib
from collections.abc import Sequence
from typing import Any

import numpy as np
import orjson

__all__ = ["HASH_SPACE", "hash_key_array", "hash_key_bytes", "key_bytes", "partition_of", "split_points", "splitmix64"]

_STR_TAG = b"s"
HASH_SPACE = 1 << 64


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


def splitmix64(z: np.ndarray) -> np.ndarray:
    """splitmix64's finalizer over uint64 values: a bijection that spreads every input bit."""
    with np.errstate(over="ignore"):
        z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return z ^ (z >> np.uint64(31))


def _mix(crc: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """splitmix64 over (crc | length << 32): uniform 64-bit values."""
    return splitmix64(crc.astype(np.uint64) | (lengths.astype(np.uint64) << np.uint64(32)))


def hash_key_bytes(kbs: Sequence[bytes]) -> np.ndarray:
    """The 64-bit hashes (uint64) of a batch of canonical key encodings."""
    n = len(kbs)
    crc = np.fromiter(map(zlib.crc32, kbs), dtype=np.uint32, count=n)
    lengths = np.fromiter(map(len, kbs), dtype=np.int64, count=n)
    return _mix(crc, lengths)


def hash_key_array(kb) -> np.ndarray:
    """`hash_key_bytes` of a large_binary Arrow array of key bytes (its lengths from its
    offsets, not from a Python object per key)."""
    n = len(kb)
    crc = np.fromiter(map(zlib.crc32, kb.to_pylist()), dtype=np.uint32, count=n)
    _, offsets, _ = kb.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64, count=kb.offset + n + 1)[kb.offset :]
    return _mix(crc, np.diff(bounds))


def partition_of(kb: bytes, num_partitions: int) -> int:
    """The partition of one key: stable across processes and machines."""
    return int(hash_key_bytes([kb])[0] % np.uint64(num_partitions))


def split_points(first_hashes: np.ndarray, rows: np.ndarray, pieces: int) -> list[int]:
    """Hash boundaries that cut a partition into about `pieces` ranges of equal rows.

    `first_hashes`/`rows` describe the partition's sorted batches (the first hash of each and
    its row count). A boundary is always a batch's first hash, so every key (one hash) stays
    inside one range. Returns the inner boundaries, increasing and distinct (maybe fewer).
    """
    order = np.argsort(first_hashes, kind="stable")
    hashes, counts = first_hashes[order], rows[order]
    cumulative = np.cumsum(counts)
    total = int(cumulative[-1]) if len(cumulative) else 0
    points: list[int] = []
    for i in range(1, pieces):
        at = int(np.searchsorted(cumulative, total * i / pieces, side="left"))
        if at + 1 < len(hashes):
            point = int(hashes[at + 1])
            if point > 0 and (not points or point > points[-1]):
                points.append(point)
    return points
