"""Functions of one value (`zephyr.expr.functions`) as Polars expressions, where Polars agrees.

Given the child's Polars expression and kind, each function is computed natively only where
Polars gives Python's result for every value of that kind (else `Untranslatable`, and the
engine runs it in Python on the records):

- `str_contains`, `str_starts_with`, `str_ends_with` of a string (UTF-8 is self-synchronizing:
  a substring of the bytes is a substring of the characters);
- `str_matches` where the pattern reads alike in both (`zephyr.engine.patterns`);
- `str_strip`, `word_count` with Python's own whitespace (`str.isspace`, which counts U+001C to
  U+001F that Rust's `char::is_whitespace` does not) spelled out to Polars;
- not `str_lower`, `str_upper`: Polars takes case from newer Unicode tables than Python's (Polars
  2.1 and Python 3.11 differ on 221 code points, e.g. U+019B, U+A7CB), and mapping only the
  ASCII rows in Polars (6x faster there) cost twice Python's time on text in other scripts,
  where each row crosses into Python and back (benchmarks/README.md, section 17);
- `is_in` of a value of the literals' own kind (str, int, float, bool): for floats Polars
  takes -0.0 for 0.0 as `==` does, and NaN, which only Polars finds in a NaN, is never a literal;
- `cast` where the conversion cannot fail and writes the same: to the same kind; int or bool to
  "float" (both round to nearest even); int to "str" (decimal); bool to "str" ("True"), to
  "int"; int or float to "bool" (`!= 0`, true for NaN in both). Not a float to "str" (Python's
  repr is its own), nor a float or str to "int" or "float" (Python's parsing and errors);
- `list_len` of a Polars list column (Parquet input; JSON lines hold lists in Python);
- `hash` of a str, int or bool: the canonical key bytes made in Polars (`b"s"` + UTF-8, `b"j"`
  + decimal or `true`/`false`) and hashed by xxHash64 natively (the `polars-hash` plugin, whose
  xxhash64 is the published algorithm, so it gives what `xxhash.xxh64_intdigest` gives).
"""

from __future__ import annotations

import functools

import polars as pl
import polars_hash  # noqa: F401  (registers the `nchash` namespace on Polars expressions)

from zephyr.engine.patterns import polars_reads_alike
from zephyr.expr.functions import FUNCTIONS

__all__ = ["DTYPES", "Untranslatable", "call_to_polars", "python_whitespace"]

DTYPES = {"str": pl.String, "int": pl.Int64, "float": pl.Float64, "bool": pl.Boolean, "uint64": pl.UInt64, "null": pl.Null}
class Untranslatable(Exception):
    """Polars could give a different result (or error) than Python here."""


def call_to_polars(name: str, args: tuple, child: pl.Expr, kind: str) -> tuple[pl.Expr, str]:
    """(the Polars expression of `child.name(*args)`, its kind), or Untranslatable."""
    if name == "cast":
        return _cast(child, kind, args[0])
    if name == "hash":
        return _hash(child, kind)
    if name == "is_in":
        return _is_in(child, kind, args[0])
    if name == "list_len":
        raise Untranslatable  # only of a list column (`zephyr.engine.translate`)
    result = FUNCTIONS[name][1]  # the functions of a string
    if kind == "null":
        return pl.lit(None, dtype=DTYPES[result]), result
    if kind != "str":
        raise Untranslatable  # Python raises a TypeError naming the record
    return _string(name, args, child), result


def _string(name: str, args: tuple, s: pl.Expr) -> pl.Expr:
    if name == "str_contains":
        return s.str.contains(args[0], literal=True)
    if name == "str_starts_with":
        return s.str.starts_with(args[0])
    if name == "str_ends_with":
        return s.str.ends_with(args[0])
    if name == "str_matches":
        if not polars_reads_alike(args[0]):
            raise Untranslatable
        return s.str.contains(args[0])
    if name == "str_strip":
        return s.str.strip_chars(python_whitespace())
    if name == "word_count":
        return s.str.count_matches(f"[^{_class_of(python_whitespace())}]+").cast(pl.Int64)
    raise Untranslatable  # str_lower, str_upper (see the module doc)


@functools.cache
def python_whitespace() -> str:
    """Every character `str.isspace` (and so `str.split`, `str.strip`) takes for whitespace."""
    return "".join(c for c in map(chr, range(0x110000)) if c.isspace())


def _class_of(chars: str) -> str:
    return "".join(f"\\x{{{ord(c):x}}}" for c in chars)


def _is_in(s: pl.Expr, kind: str, values: tuple) -> tuple[pl.Expr, str]:
    if kind == "null":
        return pl.lit(None, dtype=pl.Boolean), "bool"
    kinds = {type(v) for v in values}
    if kind not in _PYTHON_TYPES or not kinds <= {_PYTHON_TYPES[kind]}:
        raise Untranslatable  # Python's `==` across kinds: 1 == 1.0 == True
    if kind == "int" and any(not -(2**63) <= v < 2**63 for v in values):
        raise Untranslatable
    if not values:
        return pl.when(s.is_null()).then(None).otherwise(False), "bool"
    return s.is_in(pl.lit(pl.Series(values, dtype=DTYPES[kind])).implode()), "bool"


_PYTHON_TYPES = {"str": str, "int": int, "float": float, "bool": bool}


def _cast(s: pl.Expr, kind: str, to: str) -> tuple[pl.Expr, str]:
    if kind == "null":
        return pl.lit(None, dtype=DTYPES[to]), to
    if kind == to:
        return s, to
    if (kind, to) in (("int", "float"), ("bool", "float"), ("bool", "int"), ("int", "str")):
        return s.cast(DTYPES[to]), to
    if (kind, to) == ("bool", "str"):
        return pl.when(s).then(pl.lit("True")).otherwise(pl.when(s.is_not_null()).then(pl.lit("False"))), "str"
    if kind in ("int", "float") and to == "bool":
        return s != pl.lit(0, dtype=DTYPES[kind]), "bool"
    raise Untranslatable


def _hash(s: pl.Expr, kind: str) -> tuple[pl.Expr, str]:
    if kind == "null":
        return pl.lit(None, dtype=pl.UInt64), "uint64"
    if kind == "str":
        key = pl.concat_str([pl.lit("s"), s])
    elif kind in ("int", "bool"):
        key = pl.concat_str([pl.lit("j"), s.cast(pl.String)])  # -12, true: what orjson writes
    else:
        raise Untranslatable  # a float's JSON text is orjson's own; other values run in Python
    return key.nchash.xxhash64(), "uint64"
