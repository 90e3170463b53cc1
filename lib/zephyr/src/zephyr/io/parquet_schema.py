"""The Parquet schema of a shard's records: every field of every record, widened only where exact.

A field's type is a small descriptor, inferred a batch of rows at a time with bulk scans (the
types of a level's values as one `set(map(type, ...))`, then one pass per nested level):

- `None`: only nulls seen so far; `"bool"`, `"str"`, `"bytes"`, `"float"`;
- integers: `"int"` within +-2**53 (exact as float64), `"int!"` some beyond (still int64), each
  with a `+` when none is negative (`"int+"`, `"int!+"`); `"uint!"` none negative and some of
  2**63 or more (uint64, for 64-bit hashes and ids);
- `("list", element)` for lists and tuples; `("struct", {name: descriptor})` for dicts.

Two descriptors unify only where every value keeps its value: null + T -> T; integers -> the
widest of them (uint64 only while none is negative); int + float -> float when every int is
within +-2**53; structs -> the union of their fields (first-seen
order); lists -> lists of the unified elements. Anything else (str vs int, bool vs int, bytes
vs str, ints beyond uint64 or below int64, uint64-sized and negative ints together, lone surrogates, other types) is a `SchemaConflict` naming the
field (dotted path, `[]` for list elements) and both types.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Any

__all__ = ["SchemaConflict", "arrow_schema", "infer_records", "int_descriptor", "unify"]

_EXACT_IN_FLOAT = 2**53
_NONE = type(None)


class SchemaConflict(Exception):
    """A field whose values no one Parquet type holds exactly; `field` and a `reason`."""

    def __init__(self, field: str, reason: str):
        super().__init__(field, reason)
        self.field = field
        self.reason = reason


def infer_records(records: Sequence[Any]) -> tuple:
    """The struct descriptor of a batch of records (which must be dicts with str keys)."""
    kinds = set(map(type, records))
    if not all(issubclass(k, dict) for k in kinds):
        bad = next(r for r in records if not isinstance(r, dict))
        raise SchemaConflict("", f"a record must be a dict to be written as a Parquet row, got {type(bad).__name__}: {bad!r:.80}")
    return _infer_dicts(records, "")


def _infer(values: Sequence[Any], field: str) -> Any:
    types = set(map(type, values))
    whole = len(types) == 1  # no None among them either: the level is handed on as it is
    types.discard(_NONE)
    desc = None
    for kind in types:
        same = values if whole else [v for v in values if type(v) is kind]
        desc = unify(desc, _infer_kind(kind, same, field), field)
    return desc


def _infer_kind(kind: type, values: list, field: str) -> Any:
    if kind is bool:
        return "bool"
    if kind is int:
        return int_descriptor(min(values), max(values), field)
    if kind is float:
        return "float"
    if issubclass(kind, str):  # a str subclass (a StrEnum) is written as its str
        try:
            "".join(values).encode("utf-8")
        except UnicodeEncodeError:
            bad = next(v for v in values if not _utf8(v))
            raise SchemaConflict(field, f"str {bad!r:.60} holds a lone surrogate, which UTF-8 cannot encode") from None
        return "str"
    if kind is bytes:
        return "bytes"
    if kind is list or kind is tuple:
        return ("list", _infer(list(itertools.chain.from_iterable(values)), f"{field}[]"))
    if issubclass(kind, dict):
        return _infer_dicts(values, field)
    raise SchemaConflict(field, f"{kind.__name__} {values[0]!r:.60} has no exact Parquet type (write str, int, float, bool, bytes, None, lists or dicts)")


def int_descriptor(low: int, high: int, field: str) -> str:
    """The descriptor of integers from `low` to `high`."""
    if low < -(2**63) or high >= 2**64:
        big = low if low < -(2**63) else high
        raise SchemaConflict(field, f"int {big} is beyond int64 and uint64, the widest Parquet integers")
    if high >= 2**63:
        if low < 0:
            raise SchemaConflict(field, f"ints {low} and {high} in one field: {high} needs uint64, which holds no negative int")
        return "uint!"
    desc = "int!" if max(-low, high) > _EXACT_IN_FLOAT else "int"
    return desc if low < 0 else desc + "+"


# integer descriptors: (some negative, width: 0 within +-2**53, 1 int64, 2 uint64)
_INTS = {"int": (True, 0), "int!": (True, 1), "int+": (False, 0), "int!+": (False, 1), "uint!": (False, 2)}
_INT_OF = {parts: desc for desc, parts in _INTS.items()}


def _infer_dicts(dicts: Sequence[dict], field: str) -> tuple:
    names = dict.fromkeys(itertools.chain.from_iterable(dicts))
    if not all(type(name) is str for name in names):
        bad = next(name for name in names if type(name) is not str)
        raise SchemaConflict(field, f"a dict key {bad!r:.40} of type {type(bad).__name__} (Parquet field names are str)")
    # one C-level pass per field (`zip(*map(dict.values, ...))` is several times slower)
    return ("struct", {name: _infer(list(map(dict.get, dicts, itertools.repeat(name))), _join(field, name)) for name in names})


def unify(a: Any, b: Any, field: str) -> Any:
    """The descriptor holding both `a`'s and `b`'s values exactly; SchemaConflict when none does."""
    if a is None or a == b:
        return b
    if b is None:
        return a
    pair = {a, b} if isinstance(a, str) and isinstance(b, str) else None
    if pair is not None and a in _INTS and b in _INTS:
        (neg_a, width_a), (neg_b, width_b) = _INTS[a], _INTS[b]
        negative, width = neg_a or neg_b, max(width_a, width_b)
        if not (negative and width == 2):
            return _INT_OF[negative, width]
        raise SchemaConflict(field, "ints of 2**63 or more (uint64) and negative ints in one field; "
                                    "no Parquet integer holds both")
    if pair is not None and "float" in pair and (pair - {"float"}) <= {"int", "int+"}:
        return "float"
    if isinstance(a, tuple) and isinstance(b, tuple) and a[0] == b[0]:
        if a[0] == "list":
            return ("list", unify(a[1], b[1], f"{field}[]"))
        fields = dict(a[1])
        for name, desc in b[1].items():
            fields[name] = unify(fields.get(name), desc, _join(field, name))
        return ("struct", fields)
    why = " (an int beyond +-2**53 is not exact as a float)" if pair is not None and "float" in pair and pair & {"int!", "int!+", "uint!"} else ""
    first, second = sorted((_name(a), _name(b)))
    arrow = sorted(_ARROW_NAMES.get(d, "") if isinstance(d, str) else d[0] for d in (a, b))
    arrow_text = f" (Arrow {arrow[0]} and {arrow[1]})" if all(arrow) else ""
    raise SchemaConflict(field, f"values of types {first} and {second} in one field{arrow_text}{why}; "
                                "no Parquet type holds both exactly")


_ARROW_NAMES = {"int": "int64", "int!": "int64", "int+": "int64", "int!+": "int64", "uint!": "uint64",
                "float": "double", "str": "string", "bytes": "binary", "bool": "bool"}


def arrow_schema(desc: tuple):
    """The pyarrow schema of a record struct descriptor; SchemaConflict where a dict has had no
    field yet (Parquet stores no struct, and no row, without fields)."""
    import pyarrow as pa

    return pa.schema(_arrow_type(desc, "").fields) if desc[1] else _no_fields("")


def _arrow_type(desc: Any, field: str):
    import pyarrow as pa

    if desc is None:
        return pa.null()
    if isinstance(desc, str):
        return pa.uint64() if desc == "uint!" else pa.int64() if desc in _INTS else {
            "bool": pa.bool_(), "float": pa.float64(), "str": pa.string(), "bytes": pa.binary()}[desc]
    if desc[0] == "list":
        return pa.list_(_arrow_type(desc[1], f"{field}[]"))
    if not desc[1]:
        _no_fields(field)
    return pa.struct([pa.field(name, _arrow_type(d, _join(field, name))) for name, d in desc[1].items()])


def _no_fields(field: str):
    what = "a dict with no keys" if field else "a record with no fields"
    raise SchemaConflict(field, f"{what} (in every record so far), and Parquet cannot store a struct or a row without fields")


def _name(desc: Any) -> str:
    if desc in ("int!", "int!+"):
        return "int (beyond +-2**53)"
    if desc == "uint!":
        return "int (2**63 or more)"
    if isinstance(desc, str):
        return "int" if desc in _INTS else desc
    return "list" if desc[0] == "list" else "dict"


def _join(field: str, name: str) -> str:
    return f"{field}.{name}" if field else name


def _utf8(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True
