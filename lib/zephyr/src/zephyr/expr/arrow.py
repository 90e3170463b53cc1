"""Column expressions as pyarrow filters, only where pyarrow gives exactly what Python gives.

Pushdown promises the same rows as evaluating the expression on each record in Python (see
`zephyr.expr`). pyarrow differs from Python in places: integers are 64-bit (`*` wraps or
raises where Python grows), an int compared with a float is cast (Python compares exactly),
`x / 0.0` is inf (Python raises), a comparison of a string with a number is an error
(Python says "not equal"). So an expression is translated against the file's schema, and
only when every part of it provably agrees with Python:

- columns and nested fields the file has (a missing one reads as null in Python);
- comparisons of two operands of one kind: integers (any signed width, unsigned up to 32
  bits), floats, strings, bytes or booleans; an integer literal of at most 2**53 in
  magnitude counts as a float next to a float (it converts exactly);
- `+ - *` with at least one float operand (an integer operand is converted to float
  first, as Python does); `/` only by a non-zero literal, with a float on either side;
- `&`, `|`, `~` of booleans (three-valued in both), `.is_null()` of any translatable value;
- `.str_len()` of a string (both count code points);
- as a filter, the whole expression must be boolean.

Anything else (integer arithmetic, mixed kinds, other types, literals of other types) is
not translated: the reader evaluates the expression on the rows in Python instead, which
is slower (no row-group skipping) but gives the same result by definition.
"""

from __future__ import annotations

from enum import Enum
from typing import Any

from zephyr.expr.nodes import Arithmetic, Column, Compare, Expr, Field, IsNull, Literal, Logical, Not, StrLen

__all__ = ["to_arrow_filter", "to_pyarrow_expr", "translate_plainly"]

_EXACT_FLOAT_INT = 2**53  # integers up to this magnitude convert to float64 exactly


class _Kind(Enum):
    BOOL = "bool"
    INT = "int"
    FLOAT = "float"
    STR = "str"
    BYTES = "bytes"
    OTHER = "other"  # readable (is_null works) but not compared or computed with


class _NotIdentical(Exception):
    """This part of the expression could give a different result in pyarrow."""


def to_arrow_filter(expr: Expr, schema: Any) -> Any:
    """`expr` as a `pyarrow.compute.Expression` over files with `schema` (a `pyarrow.Schema`),
    or None when pyarrow could give a different result (or an error) than Python would."""
    try:
        arrow, kind, _ = _translate(expr, schema)
    except _NotIdentical:
        return None
    return arrow if kind is _Kind.BOOL else None


def _kind_of(arrow_type: Any) -> _Kind:
    import pyarrow.types as pt

    if pt.is_boolean(arrow_type):
        return _Kind.BOOL
    if pt.is_signed_integer(arrow_type) or arrow_type in _small_unsigned():
        return _Kind.INT
    if pt.is_floating(arrow_type):
        return _Kind.FLOAT
    if pt.is_string(arrow_type) or pt.is_large_string(arrow_type):
        return _Kind.STR
    if pt.is_binary(arrow_type) or pt.is_large_binary(arrow_type):
        return _Kind.BYTES
    return _Kind.OTHER


def _small_unsigned() -> tuple:
    import pyarrow as pa

    return (pa.uint8(), pa.uint16(), pa.uint32())


def _translate(expr: Expr, schema: Any) -> tuple[Any, _Kind, Any]:
    """(arrow expression, kind, the Python value when `expr` is a literal, else None)."""
    import pyarrow.compute as pc

    if isinstance(expr, (Column, Field)):
        return _field(expr, schema)
    if isinstance(expr, Literal):
        return _literal(expr.value)
    if isinstance(expr, Compare):
        return _compare(expr, schema)
    if isinstance(expr, Arithmetic):
        return _arithmetic(expr, schema)
    if isinstance(expr, Logical):
        left, right = _boolean(expr.left, schema), _boolean(expr.right, schema)
        combine = pc.and_kleene if expr.op == "&" else pc.or_kleene
        return combine(left, right), _Kind.BOOL, None
    if isinstance(expr, Not):
        return pc.invert(_boolean(expr.child, schema)), _Kind.BOOL, None
    if isinstance(expr, IsNull):
        return pc.is_null(_translate(expr.child, schema)[0]), _Kind.BOOL, None
    if isinstance(expr, StrLen):
        arrow, kind, _ = _translate(expr.child, schema)
        if kind is not _Kind.STR:
            raise _NotIdentical(expr)  # Python raises on anything but a string (or null)
        return pc.utf8_length(arrow), _Kind.INT, None
    raise _NotIdentical(expr)


def _field(expr: Column | Field, schema: Any) -> tuple[Any, _Kind, Any]:
    """A column or nested struct field the file has (else not translatable: Python sees null)."""
    import pyarrow as pa
    import pyarrow.compute as pc
    import pyarrow.types as pt

    path = (expr.name,) if isinstance(expr, Column) else _field_path(expr)
    if path[0] not in schema.names:
        raise _NotIdentical(expr)
    arrow_type = schema.field(path[0]).type
    for name in path[1:]:
        if not pt.is_struct(arrow_type) or arrow_type.get_field_index(name) < 0:
            raise _NotIdentical(expr)
        arrow_type = arrow_type.field(name).type
    arrow = pc.field(*path)
    kind = _kind_of(arrow_type)
    if kind is _Kind.FLOAT and arrow_type != pa.float64():
        arrow = arrow.cast(pa.float64())  # exact; Python computes with float64 values
    return arrow, kind, None


def _field_path(expr: Field) -> tuple[str, ...]:
    if isinstance(expr.parent, Column):
        return (expr.parent.name, expr.name)
    if isinstance(expr.parent, Field):
        return (*_field_path(expr.parent), expr.name)
    raise _NotIdentical(expr)  # a field of a computed value


def _literal(value: Any) -> tuple[Any, _Kind, Any]:
    import pyarrow as pa

    if isinstance(value, bool):
        return _scalar(value, pa.bool_()), _Kind.BOOL, value
    if isinstance(value, int):
        if not -(2**63) <= value < 2**63:
            raise _NotIdentical(value)
        return _scalar(value, pa.int64()), _Kind.INT, value
    if isinstance(value, float):
        return _scalar(value, pa.float64()), _Kind.FLOAT, value
    if isinstance(value, str):
        return _scalar(value, pa.string()), _Kind.STR, value
    if isinstance(value, bytes):
        return _scalar(value, pa.binary()), _Kind.BYTES, value
    raise _NotIdentical(value)  # None, containers, dates, ...: Python evaluates them


def _scalar(value: Any, arrow_type: Any) -> Any:
    import pyarrow as pa
    import pyarrow.compute as pc

    return pc.scalar(pa.scalar(value, arrow_type))


def _as_float(operand: tuple[Any, _Kind, Any]) -> tuple[Any, _Kind, Any]:
    """An integer literal that converts to float64 exactly, as a float literal."""
    import pyarrow as pa

    arrow, kind, value = operand
    if kind is _Kind.INT and value is not None and abs(value) <= _EXACT_FLOAT_INT:
        return _scalar(float(value), pa.float64()), _Kind.FLOAT, float(value)
    return operand


_COMPARABLE = (_Kind.BOOL, _Kind.INT, _Kind.FLOAT, _Kind.STR, _Kind.BYTES)
_COMPARE_FUNCTIONS = {"==": "equal", "!=": "not_equal", "<": "less", "<=": "less_equal", ">": "greater", ">=": "greater_equal"}


def _compare(expr: Compare, schema: Any) -> tuple[Any, _Kind, Any]:
    import pyarrow.compute as pc

    left, right = _translate(expr.left, schema), _translate(expr.right, schema)
    if {left[1], right[1]} == {_Kind.INT, _Kind.FLOAT}:
        left, right = _as_float(left), _as_float(right)  # exact only for small integer literals
    if left[1] is not right[1] or left[1] not in _COMPARABLE:
        raise _NotIdentical(expr)
    return getattr(pc, _COMPARE_FUNCTIONS[expr.op])(left[0], right[0]), _Kind.BOOL, None


_ARITHMETIC_FUNCTIONS = {"+": "add", "-": "subtract", "*": "multiply", "/": "divide"}


def _arithmetic(expr: Arithmetic, schema: Any) -> tuple[Any, _Kind, Any]:
    """Float arithmetic only: integers are unbounded in Python and 64-bit in pyarrow."""
    import pyarrow as pa
    import pyarrow.compute as pc

    left, right = _translate(expr.left, schema), _translate(expr.right, schema)
    kinds = {left[1], right[1]}
    if _Kind.FLOAT not in kinds or not kinds <= {_Kind.INT, _Kind.FLOAT}:
        raise _NotIdentical(expr)
    if expr.op == "/" and (right[2] is None or right[2] == 0):
        raise _NotIdentical(expr)  # x / 0.0 raises in Python; pyarrow gives inf or nan
    # an int operand becomes float64 as in Python (round to nearest); never out of range
    operands = [arrow.cast(pa.float64(), safe=False) if kind is _Kind.INT else arrow for arrow, kind, _ in (left, right)]
    return getattr(pc, _ARITHMETIC_FUNCTIONS[expr.op])(*operands), _Kind.FLOAT, None


def _boolean(expr: Expr, schema: Any) -> Any:
    arrow, kind, _ = _translate(expr, schema)
    if kind is not _Kind.BOOL:
        raise _NotIdentical(expr)
    return arrow


def translate_plainly(expr: Expr) -> Any:
    """`expr` as a pyarrow expression node by node, with pyarrow's semantics (no schema, no
    checks): what `zephyr.expr.to_pyarrow_expr(expr)` gives without a schema."""
    import pyarrow.compute as pc

    if isinstance(expr, Column):
        return pc.field(expr.name)
    if isinstance(expr, Field):
        return pc.struct_field(translate_plainly(expr.parent), expr.name)
    if isinstance(expr, Literal):
        return pc.scalar(expr.value)
    if isinstance(expr, Not):
        return pc.invert(translate_plainly(expr.child))
    if isinstance(expr, IsNull):
        return pc.is_null(translate_plainly(expr.child))
    functions = {Compare: _COMPARE_FUNCTIONS, Arithmetic: _ARITHMETIC_FUNCTIONS, Logical: {"&": "and_kleene", "|": "or_kleene"}}
    for kind, names in functions.items():
        if isinstance(expr, kind):
            return getattr(pc, names[expr.op])(translate_plainly(expr.left), translate_plainly(expr.right))
    raise TypeError(f"cannot translate {type(expr).__name__} {expr!r} to pyarrow")


def to_pyarrow_expr(expr: Expr, schema: Any = None) -> Any:
    """`expr` as a `pyarrow.compute.Expression`.

    With a `schema` (a `pyarrow.Schema`), only where pyarrow provably gives Python's result on
    files of that schema (`zephyr.expr.arrow`), else ValueError. Without one, node by node,
    as the reference project does: then pyarrow's semantics apply (64-bit integers, casts
    between int and float, errors on mixed types), which can differ from `evaluate`.
    """
    if schema is None:
        return translate_plainly(expr)
    arrow = to_arrow_filter(expr, schema)
    if arrow is None:
        raise ValueError(f"{expr!r} has no pyarrow filter that agrees with Python on schema {schema}")
    return arrow
