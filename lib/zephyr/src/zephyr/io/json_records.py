"""Records that still hold their JSON lines, so a JSONL writer after a shuffle copies bytes.

A columnar shuffle whose payload is JSON lines (`zephyr.shuffle.columnar.json_lines`: each record's
`orjson.dumps(record) + b"\\n"`) hands its reduce side's records on as a `JsonLines`. Iterating
it decodes them (`orjson.loads`, a slice of rows at a time). A JSON-lines writer that is handed
one instead copies each slice's line bytes into its output (`blocks`): byte for byte what
encoding the decoded records would write, without decoding or encoding anything.
"""

from __future__ import annotations

import itertools
import math
import operator
from collections.abc import Iterator
from typing import Any

import numpy as np
import orjson

__all__ = ["JsonLines", "first_non_object", "json_exact", "line_bytes"]

_JSON_TYPES = frozenset({dict, list, str, int, float, bool, type(None)})
_CONTAINERS = frozenset({dict, list})
_STR = frozenset({str})
_FLOAT = itertools.repeat(float)

class JsonLines:
    """The records of a stream of binary arrays of JSON lines (in order).

    An iterable, not an iterator: the runner hands it on as it is only to a JSONL writer, and
    as `iter(...)` (a plain iterator of records) to anything else. `iter()` always returns the
    same iterator, so reading it in pieces continues where it stopped; `blocks()` is the
    writer's way in, before anything was iterated.
    """

    def __init__(self, arrays: Iterator[Any]):
        self._arrays = arrays
        self._iterator: Iterator[Any] | None = None
        self._copied = 0

    def __iter__(self) -> Iterator[Any]:
        if self._iterator is None:
            self._iterator = itertools.chain.from_iterable(map(_decode, self._arrays))
        return self._iterator

    def blocks(self) -> Iterator[Any]:
        """The slices of rows, as large_binary arrays of lines (`line_bytes` gives their bytes);
        the records are not decoded."""
        if self._iterator is not None:
            raise RuntimeError("JsonLines.blocks() after iterating its records")
        for array in self._arrays:
            if len(array):
                self._copied += len(array)
                yield array

    def copied(self) -> Iterator[int]:
        """An iterator whose next value is how many records `blocks()` has copied so far."""
        return iter(lambda: self._copied, None)


def _decode(array) -> Iterator[Any]:
    return map(orjson.loads, array.to_pylist())


def line_bytes(array) -> memoryview:
    """The data bytes of a (possibly sliced) large_binary array's rows, without copying."""
    _, offsets, data = array.buffers()
    bounds = np.frombuffer(offsets, dtype=np.int64, count=array.offset + len(array) + 1)
    return memoryview(data)[int(bounds[array.offset]) : int(bounds[array.offset + len(array)])]


def first_non_object(array) -> int | None:
    """The row of a large_binary array of JSON lines whose value is not an object (its line
    does not start with `{`: orjson writes no whitespace before a value), or None."""
    _, offsets, data = array.buffers()
    starts = np.frombuffer(offsets, dtype=np.int64, count=array.offset + len(array))[array.offset :]
    wrong = np.flatnonzero(np.frombuffer(data, dtype=np.uint8)[starts] != ord("{"))
    return int(wrong[0]) if len(wrong) else None


def json_exact(items: Sequence[Any], check_keys: bool = True) -> bool:
    """Whether `items` hold only what JSON gives back exactly. A level of nesting at a time,
    types are gathered in bulk (`set(map(type, ...))` over the level's chained keys and
    values), so flat records cost a few C-level passes. Only called on items orjson could
    encode: no cycles, bounded depth (and so only str keys: `check_keys=False` accepts str
    subclasses among them, for a writer to which they are plain str)."""
    values = items
    while values:
        types = set(map(type, values))
        if not types <= _JSON_TYPES:
            return False
        if float in types and not all(map(math.isfinite, itertools.compress(values, map(operator.is_, map(type, values), _FLOAT)))):
            return False  # NaN and infinities would come back None
        if types.isdisjoint(_CONTAINERS):
            return True
        dicts = values if types == {dict} else [v for v in values if type(v) is dict]
        if check_keys and not set(map(type, itertools.chain.from_iterable(dicts))) <= _STR:
            return False  # orjson writes only str keys, but a str subclass would come back a str
        lists = [v for v in values if type(v) is list] if list in types else ()
        values = list(itertools.chain(itertools.chain.from_iterable(map(dict.values, dicts)), itertools.chain.from_iterable(lists)))
    return True
