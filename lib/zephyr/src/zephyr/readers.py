"""Reading a path item into records: the loaders behind load_jsonl/load_parquet/load_file."""

from __future__ import annotations

from collections.abc import Iterator
from enum import Enum
from typing import Any

from zephyr.io.compression import strip_compression_suffix
from zephyr.io.jsonl import read_jsonl
from zephyr.io.parquet import read_parquet

__all__ = ["FileFormat", "format_for", "read_path"]


class FileFormat(Enum):
    JSONL = "jsonl"
    PARQUET = "parquet"


_EXTENSIONS = {".jsonl": FileFormat.JSONL, ".ndjson": FileFormat.JSONL, ".json": FileFormat.JSONL, ".parquet": FileFormat.PARQUET}


def format_for(path: str) -> FileFormat:
    """The format a path's extension names (under any .gz/.zst); ValueError listing the known ones."""
    base = strip_compression_suffix(path).lower()
    for ext, fmt in _EXTENSIONS.items():
        if base.endswith(ext):
            return fmt
    known = ", ".join(_EXTENSIONS)
    raise ValueError(f"Cannot tell the format of {path!r} from its extension; load_file() knows {known} (optionally .gz/.zst/.zstd)")


def read_path(path: Any, fmt: FileFormat | None, on_bad_record: str = "raise", columns=None) -> Iterator[Any]:
    """Records of one file; `fmt=None` means by extension."""
    if not isinstance(path, str):
        raise TypeError(f"load_* expects path strings as items, got {type(path).__name__}: {path!r:.100}")
    fmt = fmt or format_for(path)
    if fmt is FileFormat.JSONL:
        return read_jsonl(path, on_bad_record=on_bad_record)
    return read_parquet(path, columns=columns)
