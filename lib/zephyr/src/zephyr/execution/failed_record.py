"""Which record a failure hit: its index in the shard, its `id`, `path:line` for JSON Lines, a preview.

Found after the fact, so the streaming path pays nothing. Two ways, by where the error arose:

- in a column expression (`filter(<expression>)`, `with_columns`, a `select` of a non-dict),
  wherever it ran (folded into a loader, on Arrow batches, on records): the shard's input is
  read again and replayed through the loader and the column ops after it in Python
  (`zephyr.execution.replay`); the first record on which one raises the same kind of error is
  the one. Engine-agnostic: any engine must agree with the Python evaluation.
- in a per-item function (map, filter, select): the shard counts the records it has handed to
  them (`shard._counted`, in C); the record the function was given is the last one, found
  by reading the input again up to it (after a flat_map or a window the record at fault is not
  one the shard read: none is named).

Only errors raised in those ops (or code they called) are attributed to a record: a key
function, combiner or reducer sees records a batch at a time, and zephyr's own errors (a
loader's bad line, a writer refusing a value) name theirs already.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

from zephyr.expr.nodes import Expr
from zephyr.execution.replay import Numbered, column_prefix, column_steps, first_raising, nth_through
from zephyr.plan import ops as op

__all__ = ["describe_record", "failed_record"]

PREVIEW_CHARS = 120
_PER_ITEM = (op.Map, op.Filter, op.FilterExpr, op.Select, op.WithColumns)  # one record in, at most one out
_ZEPHYR = os.path.dirname(os.path.dirname(os.path.abspath(__file__))) + os.sep  # the zephyr package


def _raised_in_per_item_function(error: BaseException, ops: tuple) -> bool:
    """The first frame of `error`'s traceback outside zephyr runs the function of one of the
    per-item `ops` (the records a shuffle's key function or a reducer raised on were pulled a
    batch ahead: the count of records read does not point at theirs)."""
    codes = {code for record in ops if (code := _code_of(_per_item_function(record))) is not None}
    tb = error.__traceback__
    while tb is not None:
        code = tb.tb_frame.f_code
        if not os.path.abspath(code.co_filename).startswith(_ZEPHYR):
            return code in codes
        tb = tb.tb_next
    return False  # raised in zephyr's own code


def _per_item_function(record: Any) -> Any:
    if isinstance(record, op.Map):
        return record.fn
    return record.predicate if isinstance(record, op.Filter) else None


def _code_of(fn: Any):
    """The code object a call of `fn` runs first (functions, bound methods, partials, objects with `__call__`)."""
    for _ in range(8):  # unwrap partials of methods of ...
        if fn is None:
            return None
        if isinstance(fn, functools.partial):
            fn = fn.func
        elif hasattr(fn, "__code__"):
            return fn.__code__
        elif hasattr(fn, "__func__"):
            fn = fn.__func__
        else:
            fn = getattr(type(fn), "__call__", None)
    return None


def failed_record(error: BaseException, ops: tuple, start_at: int, records_read: int,
                  numbered: Callable[[], Iterator[Numbered]], reread: Callable[[], Iterator]) -> str | None:
    """A description of the record the stage's ops were working on when `error` was raised, or
    None when that is not knowable (see the module doc). `numbered()` reads the shard's input
    again as its loader reads it (`replay.numbered`); `reread()` gives the items as `ops[start_at]` saw them."""
    prefix = column_prefix(ops)
    if _raised_in_column_op(error) and _evaluates_expressions(ops[:prefix]):
        found = first_raising(numbered(), column_steps(ops, prefix) or [], type(error))
        if found is not None:
            return describe_record(found[0].index, found[1], found[0].where)
    if records_read <= 0:
        return None
    if not all(isinstance(record, _PER_ITEM) or isinstance(record, op.WRITE_OPS) for record in ops[start_at:]):
        return None
    column_op_after = _raised_in_column_op(error) and any(isinstance(record, op.EXPRESSION_OPS) for record in ops[start_at:])
    if not (column_op_after or _raised_in_per_item_function(error, ops[start_at:])):
        return None
    return _handed(ops, start_at, records_read - 1, numbered, reread)


def _handed(ops: tuple, start_at: int, index: int, numbered, reread) -> str | None:
    """The `index`-th record `ops[start_at]` was handed: replayed, with where it came from,
    where the ops before can be; else (a `map_batches` before) read again through them."""
    steps = column_steps(ops, start_at)
    try:
        if steps is not None:
            found = nth_through(numbered(), steps, index)
            return None if found is None else describe_record(found[0].index, found[1], found[0].where)
        item = next(itertools.islice(reread(), index, None))
    except Exception:  # best effort: the error itself matters more than its record
        return None
    return describe_record(index, item)


def _evaluates_expressions(ops: tuple) -> bool:
    """Whether the loader and column ops `ops` evaluate anything that can fail on a record."""
    return any(isinstance(record, op.EXPRESSION_OPS) or getattr(record, "filter", None) is not None for record in ops)


def _raised_in_column_op(error: BaseException) -> bool:
    """Whether `error` was raised evaluating a column op on a record: a filter's expression, a
    `with_columns` or a `select` (not a shuffle key's expression: those see records a batch ahead)."""
    tb = error.__traceback__
    while tb is not None:
        if tb.tb_frame.f_code in _column_op_codes():
            return True
        tb = tb.tb_next
    return False


@functools.cache
def _column_op_codes() -> frozenset:
    return frozenset({Expr.__call__.__code__, op.WithColumns.apply_one.__code__, op.select_columns.__code__})


def describe_record(index: int, item: Any, where: str | None = None) -> str:
    """`record 17 of the shard (id 'doc-17', in.jsonl:18): {'id': 'doc-17', 'text': 'Lorem ...'}`"""
    notes = ([f"id {item['id']!r}"] if isinstance(item, dict) and "id" in item else []) + ([where] if where else [])
    preview = repr(item)
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 3] + "..."
    noted = f" ({', '.join(notes)})" if notes else ""
    return f"record {index} of the shard{noted}: {preview}"
