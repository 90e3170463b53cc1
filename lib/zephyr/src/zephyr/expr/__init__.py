"""Column expressions: filters and computed values that Zephyr can read and push into readers.

    from zephyr import col, lit

    ds.filter((col("score") > 0.5) & col("lang").is_not_null() & (col("meta")["source"] == "web"))

An expression is data, not a function: a plan prints it (`filter((col('score') > lit(0.5)))`), and
a filter right after `load_parquet()` is handed to pyarrow, which skips row groups whose
statistics rule the predicate out (see `zephyr.plan.pushdown`), wherever pyarrow provably gives
the same result as Python (see `zephyr.expr.arrow`). Here it evaluates on Python dicts, with
SQL null rules: a comparison or arithmetic with a missing value gives null, `&`/`|` follow
three-valued logic, and `filter` keeps only rows where the predicate is true. Booleans are
strict: `&`, `|`, `~` and `filter` need true, false or null and raise a TypeError on any other
value (`filter(col("n"))` on a number is an error, not a truthiness test). Use `&`, `|`, `~`
(Python's `and`, `or`, `not` cannot be overloaded and raise a TypeError on an expression).

Functions of one value for curation (`zephyr.expr.functions` defines each): `.str_contains(s)`,
`.str_matches(pattern)`, `.str_starts_with(s)`, `.str_ends_with(s)`, `.str_lower()`,
`.str_upper()`, `.str_strip()`, `.word_count()`, `.str_len()`, `.list_len()`, `.is_in(values)`,
`.cast(kind)`, `.hash()`; and SQL's CASE, `when(cond).then(a).otherwise(b)`.
"""

from zephyr.expr.arrow import to_pyarrow_expr
from zephyr.expr.nodes import (
    Arithmetic,
    ArithmeticExpr,
    Call,
    Case,
    Column,
    ColumnExpr,
    Compare,
    CompareExpr,
    Expr,
    Field,
    FieldAccessExpr,
    IsNull,
    IsNullExpr,
    Literal,
    LiteralExpr,
    Logical,
    LogicalExpr,
    Not,
    NotExpr,
    StrLen,
    When,
    col,
    lit,
    referenced_columns,
    referenced_fields,
    when,
)

__all__ = [
    "Arithmetic", "ArithmeticExpr", "Call", "Case", "Column", "ColumnExpr", "Compare", "CompareExpr", "Expr", "Field",
    "FieldAccessExpr", "IsNull", "IsNullExpr", "Literal", "LiteralExpr", "Logical", "LogicalExpr", "Not", "NotExpr", "StrLen",
    "When", "col", "lit", "referenced_columns", "referenced_fields", "to_pyarrow_expr", "when",
]
