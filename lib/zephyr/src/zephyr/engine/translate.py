"""Column expressions as Polars expressions, only where Polars gives exactly what Python gives.

An expression means what it means on a Python record (`zephyr.expr.nodes`); Polars computes it
natively only where the two provably agree for the frame's column types, and otherwise the
engine evaluates it on the records (`zephyr.execution.engine_ops`). Where they differ: integers are
64-bit in Polars (`+ - *` wrap, Python grows), an int compared with a float is cast in Polars
(Python compares exactly), `x / 0.0` is inf (Python raises), a string compared with a number
is an error (Python says "not equal" or raises). So Polars gets:

- columns the frame holds with one type (string, integer, float, boolean, or all null);
- comparisons of two operands of one kind (str, int, float, bool); an integer literal of at
  most 2**53 in magnitude next to a float column (it converts exactly);
- `+ - *` with a float operand on either side (Python converts the int too); `/` by a non-zero
  literal with a float on either side; `+` of two strings;
- `&`, `|`, `~` of booleans (three-valued in both), `.is_null()` of anything translated;
- `.str_len()` of a string (both count code points);
- the functions of one value where `zephyr.engine.calls` says Polars agrees (strings, `is_in`,
  `cast`, `list_len`, `hash`);
- `when(...).then(...).otherwise(...)` whose conditions are boolean and whose values are all of
  one kind (Polars would cast an int beside a float); a null condition is false in both;
- as a filter, the whole expression must be boolean or null.

Nested fields and anything else run in Python, which gives the same result by definition.
"""

from __future__ import annotations

import math
from typing import Any

import polars as pl

from zephyr.engine.calls import DTYPES, Untranslatable, call_to_polars
from zephyr.expr.nodes import Arithmetic, Call, Case, Column, Compare, Expr, IsNull, Literal, Logical, Not, StrLen

__all__ = ["KINDS", "kind_of_dtype", "to_polars", "to_polars_filter"]

_EXACT_FLOAT_INT = 2**53
_INT64 = 2**63
# Polars dtypes a frame column may have, by the kind of Python value each holds
# (64-bit floats only: a float32's Python value is its float64 widening, which Polars writes otherwise;
# unsigned 64-bit integers compare with an Int64 literal through a float)
# unsigned 64-bit ones are a kind of their own, "uint64" (a `hash()`), compared only with each other)
KINDS = {pl.String: "str", pl.Float64: "float", pl.Boolean: "bool", pl.Null: "null", pl.UInt64: "uint64",
         **dict.fromkeys((pl.Int8, pl.Int16, pl.Int32, pl.Int64, pl.UInt8, pl.UInt16, pl.UInt32), "int")}


def kind_of_dtype(dtype: Any) -> str | None:
    """The kind of Python value a column of `dtype` holds ("str", "int", ...), or None."""
    for known, kind in KINDS.items():
        if dtype == known:
            return kind
    return None


def to_polars(expr: Expr, schema: dict[str, Any]) -> tuple[pl.Expr, str] | None:
    """(the Polars expression, the kind of its values) for a frame with `schema` (column name ->
    Polars dtype), or None where Polars could differ from Python."""
    try:
        return _translate(expr, schema)
    except Untranslatable:
        return None


def to_polars_filter(expr: Expr, schema: dict[str, Any]) -> pl.Expr | None:
    """A boolean mask (null as false) that keeps what `filter(expr)` keeps, or None."""
    made = to_polars(expr, schema)
    if made is None or made[1] not in ("bool", "null"):
        return None  # Python raises on a non-boolean filter value, naming the record
    polars, kind = made
    return pl.lit(False) if kind == "null" else polars.fill_null(False)


def _translate(expr: Expr, schema: dict[str, Any]) -> tuple[pl.Expr, str]:
    if isinstance(expr, Column):
        if expr.name not in schema or (kind := kind_of_dtype(schema[expr.name])) is None:
            raise Untranslatable
        return pl.col(expr.name), kind
    if isinstance(expr, Literal):
        return _literal(expr.value)
    if isinstance(expr, Compare):
        return _compare(expr, schema)
    if isinstance(expr, Arithmetic):
        return _arithmetic(expr, schema)
    if isinstance(expr, Logical):
        (a, ka), (b, kb) = _translate(expr.left, schema), _translate(expr.right, schema)
        if not {ka, kb} <= {"bool", "null"}:
            raise Untranslatable
        return ((_as_bool(a, ka) & _as_bool(b, kb)) if expr.op == "&" else (_as_bool(a, ka) | _as_bool(b, kb))), "bool"
    if isinstance(expr, Not):
        child, kind = _translate(expr.child, schema)
        if kind not in ("bool", "null"):
            raise Untranslatable
        return ~_as_bool(child, kind), "bool"
    if isinstance(expr, IsNull):
        child, _ = _translate(expr.child, schema)
        return child.is_null(), "bool"
    if isinstance(expr, StrLen):
        child, kind = _translate(expr.child, schema)
        if kind == "null":
            return pl.lit(None, dtype=pl.Int64), "int"
        if kind != "str":
            raise Untranslatable
        return child.str.len_chars().cast(pl.Int64), "int"
    if isinstance(expr, Call):
        if expr.name == "list_len" and isinstance(expr.child, Column) and isinstance(schema.get(expr.child.name), pl.List):
            return pl.col(expr.child.name).list.len().cast(pl.Int64), "int"
        return call_to_polars(expr.name, expr.args, *_translate(expr.child, schema))
    if isinstance(expr, Case):
        return _case(expr, schema)
    raise Untranslatable


def _case(expr: Case, schema: dict[str, Any]) -> tuple[pl.Expr, str]:
    """SQL's CASE in Polars' `when`: a null condition goes on to the next branch in both."""
    conditions = [_translate(condition, schema) for condition, _ in expr.branches]
    values = [_translate(value, schema) for _, value in expr.branches]
    values.append(_translate(expr.default, schema) if expr.default is not None else (pl.lit(None), "null"))
    if any(kind not in ("bool", "null") for _, kind in conditions):
        raise Untranslatable  # Python raises on a condition that is not a boolean
    kinds = {kind for _, kind in values} - {"null"}
    if len(kinds) > 1:
        raise Untranslatable  # Polars would make an int beside a float a float
    kind = kinds.pop() if kinds else "null"
    typed = [v if k == kind else pl.lit(None, dtype=DTYPES[kind]) for v, k in values]
    chain = pl.when(_as_bool(*conditions[0])).then(typed[0])
    for (condition, condition_kind), value in zip(conditions[1:], typed[1:-1]):
        chain = chain.when(_as_bool(condition, condition_kind)).then(value)
    return chain.otherwise(typed[-1]), kind


def _as_bool(polars: pl.Expr, kind: str) -> pl.Expr:
    return polars.cast(pl.Boolean) if kind == "null" else polars


def _literal(value: Any) -> tuple[pl.Expr, str]:
    if value is None:
        return pl.lit(None), "null"
    if type(value) is bool:
        return pl.lit(value, dtype=pl.Boolean), "bool"
    if type(value) is int and -_INT64 <= value < _INT64:
        return pl.lit(value, dtype=pl.Int64), "int"
    if type(value) is float and math.isfinite(value):
        return pl.lit(value, dtype=pl.Float64), "float"
    if type(value) is str:
        return pl.lit(value, dtype=pl.String), "str"
    raise Untranslatable


def _compare(expr: Compare, schema: dict[str, Any]) -> tuple[pl.Expr, str]:
    (a, ka), (b, kb) = _translate(expr.left, schema), _translate(expr.right, schema)
    if "null" in (ka, kb):
        return pl.lit(None, dtype=pl.Boolean), "bool"
    if ka != kb and not (_exact_float(expr.left, ka, kb) or _exact_float(expr.right, kb, ka)):
        raise Untranslatable
    ops = {"==": a.eq, "!=": a.ne, "<": a.lt, "<=": a.le, ">": a.gt, ">=": a.ge}
    return ops[expr.op](b), "bool"


def _exact_float(node: Expr, kind: str, other: str) -> bool:
    """An integer literal next to a float that converts to float exactly, as Python compares it."""
    return kind == "int" and other == "float" and isinstance(node, Literal) and abs(node.value) <= _EXACT_FLOAT_INT


def _arithmetic(expr: Arithmetic, schema: dict[str, Any]) -> tuple[pl.Expr, str]:
    (a, ka), (b, kb) = _translate(expr.left, schema), _translate(expr.right, schema)
    if "null" in (ka, kb):
        return pl.lit(None, dtype=pl.Float64), "null"
    if expr.op == "+" and ka == kb == "str":
        return a + b, "str"
    if not {ka, kb} <= {"int", "float"} or "float" not in (ka, kb):
        raise Untranslatable  # integer arithmetic is unbounded in Python
    if expr.op == "/" and not (isinstance(expr.right, Literal) and expr.right.value != 0):
        raise Untranslatable  # Python raises ZeroDivisionError where Polars gives inf or NaN
    a, b = a.cast(pl.Float64), b.cast(pl.Float64)
    return {"+": a + b, "-": a - b, "*": a * b, "/": a / b}[expr.op], "float"
