"""The expression tree: nodes that evaluate on dicts with SQL null rules (see `zephyr.expr`)."""

from __future__ import annotations

import operator
from dataclasses import dataclass, field
from typing import Any

from zephyr.expr.functions import FUNCTIONS, checked_arguments, prepared

__all__ = [
    "ArithmeticExpr", "Call", "Case", "ColumnExpr", "CompareExpr", "Expr", "FieldAccessExpr", "IsNullExpr", "LiteralExpr",
    "LogicalExpr", "NotExpr", "When", "col", "lit", "referenced_columns", "referenced_fields", "when",
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

    # functions of one value, defined in `zephyr.expr.functions` (null in, null out)
    def str_contains(self, substring: str) -> Expr:
        """Whether a string holds `substring` (no pattern: the characters as they are)."""
        return Call(self, "str_contains", (substring,))

    def str_matches(self, pattern: str) -> Expr:
        """Whether Python's `re.search(pattern, value)` finds a match in a string."""
        return Call(self, "str_matches", (pattern,))

    def str_starts_with(self, prefix: str) -> Expr:
        return Call(self, "str_starts_with", (prefix,))

    def str_ends_with(self, suffix: str) -> Expr:
        return Call(self, "str_ends_with", (suffix,))

    def str_lower(self) -> Expr:
        return Call(self, "str_lower")

    def str_upper(self) -> Expr:
        return Call(self, "str_upper")

    def str_strip(self) -> Expr:
        """A string without leading and trailing whitespace (Python's `str.strip()`)."""
        return Call(self, "str_strip")

    def word_count(self) -> Expr:
        """The number of words in a string: maximal runs of non-whitespace (`len(s.split())`)."""
        return Call(self, "word_count")

    def list_len(self) -> Expr:
        return Call(self, "list_len")

    def is_in(self, values: list | tuple | set | frozenset) -> Expr:
        """Whether the value `==` one of `values`, literals of one kind (str, int, float, bool)."""
        return Call(self, "is_in", (values,))

    def cast(self, kind: str) -> Expr:
        """The value as "str", "int", "float" or "bool", converted as Python's `str()`, `int()`,
        `float()`, `bool()` do (see `zephyr.expr.functions`)."""
        return Call(self, "cast", (kind,))

    def hash(self) -> Expr:
        """A stable 64-bit hash of the value (xxHash64 of its canonical bytes), an int in [0, 2**64)."""
        return Call(self, "hash")

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


@dataclass(frozen=True, eq=False, repr=False)
class Call(Expr):
    """`child.name(*args)`: a function of one value (`zephyr.expr.functions`); null gives null."""

    child: Expr
    name: str
    args: tuple = ()
    _call: tuple = field(init=False, repr=False)  # (the Python function, its prepared arguments)

    def __post_init__(self) -> None:
        object.__setattr__(self, "args", checked_arguments(self.name, tuple(self.args)))
        object.__setattr__(self, "_call", (FUNCTIONS[self.name][0], prepared(self.name, self.args)))

    def evaluate(self, record: Any) -> Any:
        value = self.child.evaluate(record)
        if value is None:
            return None
        function, args = self._call
        return function(value, self, *args)

    def __reduce__(self) -> tuple:
        return (Call, (self.child, self.name, self.args))  # a compiled pattern is made again

    def __repr__(self) -> str:
        return f"{self.child!r}.{self.name}({', '.join(repr(list(a)) if isinstance(a, tuple) else repr(a) for a in self.args)})"


class When:
    """`when(condition)` waiting for its `.then(value)`; not an expression yet."""

    def __init__(self, branches: tuple, condition: Any):
        self._branches, self._condition = branches, _wrap(condition)

    def then(self, value: Any) -> Case:
        return Case(self._branches + ((self._condition, _wrap(value)),))

    def __repr__(self) -> str:
        return f"{Case(self._branches)!r}.when({self._condition!r})" if self._branches else f"when({self._condition!r})"


def when(condition: Any) -> When:
    """SQL's CASE: `when(cond).then(a).when(cond2).then(b).otherwise(c)`.

    The value of the first branch whose condition is true (a null condition counts as false;
    a condition that is not true, false or null is a TypeError), else `otherwise`'s (null
    without one). Only the branch taken is evaluated, as in Python."""
    return When((), condition)


@dataclass(frozen=True, eq=False, repr=False)
class Case(Expr):
    branches: tuple  # ((condition, value), ...)
    default: Expr | None = None  # None: no otherwise (null)

    def when(self, condition: Any) -> When:
        if self.default is not None:
            raise TypeError(f"{self!r} is complete: when() goes before otherwise()")
        return When(self.branches, condition)

    def otherwise(self, value: Any) -> Case:
        if self.default is not None:
            raise TypeError(f"{self!r} has its otherwise() already")
        return Case(self.branches, _wrap(value))

    def evaluate(self, record: Any) -> Any:
        for condition, value in self.branches:
            if _truth(condition.evaluate(record), condition, "when({!r})") is True:
                return value.evaluate(record)
        return None if self.default is None else self.default.evaluate(record)

    def __repr__(self) -> str:
        text = "".join(f"{'.' if i else ''}when({c!r}).then({v!r})" for i, (c, v) in enumerate(self.branches))
        return text if self.default is None else f"{text}.otherwise({self.default!r})"


def children(expr: Expr) -> tuple:
    """The expressions `expr` is made of."""
    if isinstance(expr, Case):
        return tuple(e for branch in expr.branches for e in branch) + (() if expr.default is None else (expr.default,))
    if isinstance(expr, Field):
        return (expr.parent,)
    if isinstance(expr, (Compare, Arithmetic, Logical)):
        return (expr.left, expr.right)
    return (expr.child,) if isinstance(expr, (Not, IsNull, StrLen, Call)) else ()


def referenced_columns(expr: Expr) -> set[str]:
    """The top-level column names an expression reads."""
    if isinstance(expr, Column):
        return {expr.name}
    return set().union(*map(referenced_columns, children(expr)))


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
