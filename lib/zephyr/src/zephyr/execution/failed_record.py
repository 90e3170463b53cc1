"""Which record a user function failed on: its index in the shard, its `id`, a short preview.

Found after the fact, so the streaming path pays nothing: the shard counts the records it has
read (`shard._counted`, in C); when a per-item function (map, filter, select) raises,
the record it was given is the last one read, so the shard's input is read again up to it
(after a flat_map or a window the record at fault is not one the shard read: none is named). Only
errors raised in the function of one of those per-item ops (or code it called) are attributed
to a record: a key function, combiner or reducer sees records a batch at a time, and zephyr's own
errors (a loader's bad line, a writer refusing a value) name theirs already.
"""

from __future__ import annotations

import functools
import itertools
import os
from collections.abc import Callable, Iterator
from typing import Any

from zephyr.plan import ops as op

__all__ = ["describe_record", "failed_record"]

PREVIEW_CHARS = 120
_PER_ITEM = (op.Map, op.Filter, op.FilterExpr, op.Select)  # one record in, at most one out
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
                  reread: Callable[[], Iterator]) -> str | None:
    """A description of the record the stage's per-item ops were working on when `error` was
    raised, or None when that is not knowable (no record read yet, an op that sees many
    records at once, an error of zephyr's own, or the input cannot be read again)."""
    if records_read <= 0:
        return None
    if not all(isinstance(record, _PER_ITEM) or isinstance(record, op.WRITE_OPS) for record in ops[start_at:]):
        return None
    if not _raised_in_per_item_function(error, ops[start_at:]):
        return None
    index = records_read - 1
    try:
        item = next(itertools.islice(reread(), index, None))
    except Exception:  # best effort: the error itself matters more than its record
        return None
    return describe_record(index, item)


def describe_record(index: int, item: Any) -> str:
    """`record 17 of the shard (id 'doc-17'): {'id': 'doc-17', 'text': 'Lorem ...'}`"""
    ident = f" (id {item['id']!r})" if isinstance(item, dict) and "id" in item else ""
    preview = repr(item)
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 3] + "..."
    return f"record {index} of the shard{ident}: {preview}"
