"""Which record a user function failed on: its index in the shard, its `id`, a short preview.

Found after the fact, so the streaming path pays nothing: the shard counts the records it has
read (`shard._counted`, in C); when a per-item function (map, filter, select) raises,
the record it was given is the last one read, so the shard's input is read again up to it
(after a flat_map or a window the record at fault is not one the shard read: none is named). Only
errors raised outside zephyr (in the user's code or a library it called) are attributed to a
record; zephyr's own errors (a loader's bad line, a writer refusing a value) name theirs already.
"""

from __future__ import annotations

import itertools
import os
import traceback
from collections.abc import Callable, Iterator
from typing import Any

from zephyr.plan import ops as op

__all__ = ["describe_record", "failed_record"]

PREVIEW_CHARS = 120
_PER_ITEM = (op.Map, op.Filter, op.FilterExpr, op.Select)  # one record in, at most one out
_ZEPHYR = os.path.dirname(os.path.abspath(__file__)) + os.sep


def _raised_by_user_code(error: BaseException) -> bool:
    frames = traceback.extract_tb(error.__traceback__)
    return bool(frames) and not os.path.abspath(frames[-1].filename).startswith(_ZEPHYR)


def failed_record(error: BaseException, ops: tuple, start_at: int, records_read: int,
                  reread: Callable[[], Iterator]) -> str | None:
    """A description of the record the stage's per-item ops were working on when `error` was
    raised, or None when that is not knowable (no record read yet, an op that sees many
    records at once, an error of zephyr's own, or the input cannot be read again)."""
    if records_read <= 0 or not _raised_by_user_code(error):
        return None
    if not all(isinstance(record, _PER_ITEM) or isinstance(record, op.WRITE_OPS) for record in ops[start_at:]):
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
