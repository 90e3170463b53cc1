"""What a writer refuses: a record it cannot store so that it reads back unchanged."""

from __future__ import annotations

import pyarrow as pa

__all__ = ["UnwritableRecordError", "field_path"]


class UnwritableRecordError(pa.ArrowInvalid):
    """A record a writer would change (or cannot store); names the output path, the record's
    index in the shard (0-based), the field (a dotted path, `[i]` for list elements) and why.
    Raised before the output appears. A ValueError, and pyarrow's ArrowInvalid (what the
    reference project's writers raise for a type conflict)."""

    def __init__(self, path: str, record: int, field: str, reason: str):
        where = f", field {field!r}" if field else ""
        super().__init__(f"{path}: record {record}{where}: {reason}")
        self.path = path
        self.record = record
        self.field = field
        self.reason = reason

    def __reduce__(self):
        return (UnwritableRecordError, (self.path, self.record, self.field, self.reason))


def field_path(parent: str, key: object) -> str:
    """`a` + `b` -> `a.b`; `a` + 0 -> `a[0]` (an int key is a list position)."""
    if isinstance(key, int):
        return f"{parent}[{key}]"
    return f"{parent}.{key}" if parent else str(key)
