"""The expression tree: nodes that evaluate on dicts with SQL null rules (see `zephyr.expr`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass
from typing import Any

__all__ = [
    "ArithmeticExpr", "ColumnExpr", "CompareExpr", "Expr", "FieldAccessExpr", "IsNullExpr", "LiteralExpr", "LogicalExpr",
    "NotExpr", "col", "lit", "referenced_columns", "referenced_fields",
]


class Expr:
    """Base of every expression; build them with `col`, `lit` and the operators."""

    def evaluate(self, record: Any) -> Any:
        """The value of this expression for one record (a dict); None stands for null."""
        raise NotImplementedError

    def __call__(self, record: Any) -> bool:
        """As a predicate: true only when the expression is true (null counts as false)."""
        return _truth(self.evaluate(record), self, "filter({!r})") is True

    def __bool__(self) -> bool:
        raise TypeError(f"the truth value of the expression {self!r} is unknown until it runs; use & | ~ instead of and/or/not")

    def __hash__(self) -> int:
        """By the text, so equal expressions can be set members and dict keys (see `Compare.__bool__`)."""
        return hash(repr(self))

    # comparisons build expressions (so `==` does not compare expressions)
    def __eq__(self, other: Any) -> Expr:  # type: ignore[override]
        return Compare(self, _wrap(other), "==")

    def __ne__(self, other: Any) -> Expr:  # type: ignore[override]
        return Compare(self, _wrap(other), "!=")

    def __lt__(self, other: Any) -> Expr:
        return Compare(self, _wrap(other), "<")

    def __le__(self, other: Any) -> Expr:
        return Compare(self, _wrap(other), "<=")

    def __gt__(self, other: Any) -> Expr:
        return Compare(self, _wrap(other), ">")

    def __ge__(self, other: Any) -> Expr:
        return Compare(self, _wrap(other), ">=")

    def __add__(self, other: Any) -> Expr:
        return Arithmetic(self, _wrap(other), "+")

    def __radd__(self, other: Any) -> Expr:
        return Arithmetic(_wrap(other), self, "+")

    def __sub__(self, other: Any) -> Expr:
        return Arithmetic(self, _wrap(other), "-")

    def __rsub__(self, other: Any) -> Expr:
        return Arithmetic(_wrap(other), self, "-")

    def __mul__(self, other: Any) -> Expr:
        return Arithmetic(self, _wrap(other), "*")

    def __rmul__(self, other: Any) -> Expr:
        return Arithmetic(_wrap(other), self, "*")

    def __truediv__(self, other: Any) -> Expr:
        return Arithmetic(self, _wrap(other), "/")

    def __rtruediv__(self, other: Any) -> Expr:
        return Arithmetic(_wrap(other), self, "/")

    def __and__(self, other: Any) -> Expr:
        return Logical(self, _wrap(other), "&")

    def __rand__(self, other: Any) -> Expr:
        return Logical(_wrap(other), self, "&")

    def __or__(self, other: Any) -> Expr:
        return Logical(self, _wrap(other), "|")

    def __ror__(self, other: Any) -> Expr:
        return Logical(_wrap(other), self, "|")

    def __invert__(self) -> Expr:
        return Not(self)

    def __getitem__(self, name: str) -> Expr:
        """A field of a nested (struct / dict) value: `col("meta")["score"]`."""
        if not isinstance(name, str):
            raise TypeError(f"nested fields are named by strings, got {name!r}")
        return Field(self, name)

    def is_null(self) -> Expr:
        return IsNull(self)

    def is_not_null(self) -> Expr:
        return Not(IsNull(self))

    def str_len(self) -> Expr:
        """The length of a string value in characters (code points, as Python's `len`); null
        stays null, and any other value is a TypeError."""
        return StrLen(self)

    # per-key aggregations of this value, for `group_by(key).agg(...)` (computed by `zephyr.aggregate`)
    def sum(self) -> Aggregation:
        return Aggregation("sum", self)

    def min(self) -> Aggregation:
        return Aggregation("min", self)

    def max(self) -> Aggregation:
        return Aggregation("max", self)

    def mean(self) -> Aggregation:
        return Aggregation("mean", self)

    def first(self) -> Aggregation:
        return Aggregation("first", self)

    def collect(self) -> Aggregation:
        return Aggregation("collect", self)

    def count(self) -> Aggregation:
        """Rows per key where this value is not null."""
        return Aggregation("count", self)


@dataclass(frozen=True)
class Aggregation:
    """A per-key aggregation of a value (`col("n").sum()`), for `group_by(key).agg(...)`."""

    kind: str  # "count", "sum", "min", "max", "mean", "first", "collect"
    child: Any  # the Expr it reads, or None (count rows)


def _wrap(value: Any) -> Expr:
    return value if isinstance(value, Expr) else Literal(value)


def col(name: str) -> Expr:
    """The value of the top-level field `name` of each record (null when it is missing).

    >>> col("score") > 0.5
    (col('score') > lit(0.5))
    """
    if not isinstance(name, str) or not name:
        raise TypeError(f"col() takes a column name, got {name!r}")
    return Column(name)


def lit(value: Any) -> Expr:
    """A constant; plain Python values in an expression are wrapped in `lit` automatically."""
    return Literal(value)


@dataclass(frozen=True, eq=False, repr=False)
class Column(Expr):
    name: str

    def evaluate(self, record: Any) -> Any:
        if not isinstance(record, dict):
            raise TypeError(f"{self!r} needs dict records, got {type(record).__name__}: {record!r:.80}")
        return record.get(self.name)

    def __repr__(self) -> str:
        return f"col({self.name!r})"


@dataclass(frozen=True, eq=False, repr=False)
class Literal(Expr):
    value: Any

    def evaluate(self, record: Any) -> Any:
        return self.value

    def __repr__(self) -> str:
        return f"lit({self.value!r})"


@dataclass(frozen=True, eq=False, repr=False)
class Field(Expr):
    parent: Expr
    name: str

    def evaluate(self, record: Any) -> Any:
        value = self.parent.evaluate(record)
        return value.get(self.name) if isinstance(value, dict) else None

    def __repr__(self) -> str:
        return f"{self.parent!r}[{self.name!r}]"


_COMPARE = {"==": operator.eq, "!=": operator.ne, "<": operator.lt, "<=": operator.le, ">": operator.gt, ">=": operator.ge}
_ARITHMETIC = {"+": operator.add, "-": operator.sub, "*": operator.mul, "/": operator.truediv}


# the reference project's operator names, accepted by the constructors (`CompareExpr(a, b, "ge")`)
_OP_NAMES = {"eq": "==", "ne": "!=", "lt": "<", "le": "<=", "gt": ">", "ge": ">=", "add": "+", "sub": "-", "mul": "*",
             "truediv": "/", "and": "&", "or": "|"}


class _Binary(Expr):
    """`left op right`; `op` is a symbol ("==", "+", "&") or the reference's name for it ("eq", "add", "and")."""

    _ops: dict = {}

    def __post_init__(self) -> None:
        op = _OP_NAMES.get(self.op, self.op)
        if op not in self._ops:
            raise ValueError(f"{type(self).__name__} op must be one of {sorted(self._ops)}, got {self.op!r}")
        object.__setattr__(self, "op", op)

    def __repr__(self) -> str:
        return f"({self.left!r} {self.op} {self.right!r})"


@dataclass(frozen=True, eq=False, repr=False)
class Compare(_Binary):
    left: Expr
    right: Expr
    op: str
    _ops = _COMPARE

    def evaluate(self, record: Any) -> Any:
        a, b = self.left.evaluate(record), self.right.evaluate(record)
        return None if a is None or b is None else _COMPARE[self.op](a, b)

    def __bool__(self) -> bool:
        """Only for looking an expression up in a set or dict, where Python asks `bool(a == b)`:
        two expressions of the same text are equal. Any other truth test raises, as for every
        expression (`if col("a") == 1:` or `and`/`or` would silently mean something else)."""
        if self.op in ("==", "!=") and isinstance(self.left, Expr) and repr(self.left) == repr(self.right):
            return self.op == "=="
        return Expr.__bool__(self)


@dataclass(frozen=True, eq=False, repr=False)
class Arithmetic(_Binary):
    left: Expr
    right: Expr
    op: str
    _ops = _ARITHMETIC

    def evaluate(self, record: Any) -> Any:
        a, b = self.left.evaluate(record), self.right.evaluate(record)
        return None if a is None or b is None else _ARITHMETIC[self.op](a, b)


def _truth(value: Any, node: Expr, where: str = "{!r}") -> bool | None:
    """A boolean operand (None for null); any other value is a TypeError naming `node` (its
    text, formatted into `where`, is built only then: this runs once per record)."""
    if value is None or isinstance(value, bool):
        return value
    raise TypeError(f"{where.format(node)} needs true, false or null, got {type(value).__name__} {value!r:.80}; "
                    "compare it explicitly")


@dataclass(frozen=True, eq=False, repr=False)
class Logical(_Binary):
    """`&` / `|` with three-valued (Kleene) logic: false & null is false, true | null is true."""

    left: Expr
    right: Expr
    op: str
    _ops = {"&": None, "|": None}

    def evaluate(self, record: Any) -> Any:
        decisive = self.op == "|"  # the value that settles the result on its own
        a = _truth(self.left.evaluate(record), self)
        if a is decisive:
            return decisive
        b = _truth(self.right.evaluate(record), self)
        if b is decisive:
            return decisive
        return None if a is None or b is None else not decisive


@dataclass(frozen=True, eq=False, repr=False)
class Not(Expr):
    child: Expr

    def evaluate(self, record: Any) -> Any:
        value = _truth(self.child.evaluate(record), self)
        return None if value is None else not value

    def __repr__(self) -> str:
        if isinstance(self.child, IsNull):
            return f"{self.child.child!r}.is_not_null()"
        return f"~({self.child!r})"


@dataclass(frozen=True, eq=False, repr=False)
class IsNull(Expr):
    child: Expr

    def evaluate(self, record: Any) -> Any:
        return self.child.evaluate(record) is None

    def __repr__(self) -> str:
        return f"{self.child!r}.is_null()"


@dataclass(frozen=True, eq=False, repr=False)
class StrLen(Expr):
    child: Expr

    def evaluate(self, record: Any) -> Any:
        value = self.child.evaluate(record)
        if value is None or isinstance(value, str):
            return None if value is None else len(value)
        raise TypeError(f"{self!r} needs a string, got {type(value).__name__} {value!r:.80}")

    def __repr__(self) -> str:
        return f"{self.child!r}.str_len()"


def referenced_columns(expr: Expr) -> set[str]:
    """The top-level column names an expression reads."""
    if isinstance(expr, Column):
        return {expr.name}
    if isinstance(expr, (Field, Not, IsNull, StrLen)):
        return referenced_columns(expr.parent if isinstance(expr, Field) else expr.child)
    if isinstance(expr, (Compare, Arithmetic, Logical)):
        return referenced_columns(expr.left) | referenced_columns(expr.right)
    return set()


def referenced_fields(expr: Expr) -> set[tuple[str, ...]]:
    """The column paths an expression reads: `("score",)` for `col("score")`, `("meta", "x")`
    for `col("meta")["x"]` (a field of a computed value counts as what that value reads)."""
    if isinstance(expr, Column):
        return {(expr.name,)}
    if isinstance(expr, Field):
        inner = referenced_fields(expr.parent)
        return {(*path, expr.name) for path in inner} if isinstance(expr.parent, (Column, Field)) else inner
    if isinstance(expr, (Not, IsNull, StrLen)):
        return referenced_fields(expr.child)
    if isinstance(expr, (Compare, Arithmetic, Logical)):
        return referenced_fields(expr.left) | referenced_fields(expr.right)
    return set()


# the reference project's class names (zephyr.expr.ColumnExpr, ...): the same classes
ColumnExpr = Column
LiteralExpr = Literal
CompareExpr = Compare
ArithmeticExpr = Arithmetic
LogicalExpr = Logical
NotExpr = Not
IsNullExpr = IsNull
FieldAccessExpr = Field
