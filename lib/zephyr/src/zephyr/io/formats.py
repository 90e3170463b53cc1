"""File formats by name: the one detector that `load_file()`, the planner's checks and
Marin's training reader share, so what one reads the others read."""

from __future__ import annotations

from enum import Enum

from zephyr.io.compression import COMPRESSION_SUFFIXES, strip_compression_suffix

__all__ = ["DEFAULT_FILE_PATH_COLUMN", "FileFormat", "format_for"]

DEFAULT_FILE_PATH_COLUMN = "__file_path"  # where include_file_paths puts each record's file


class FileFormat(Enum):
    JSONL = "jsonl"
    PARQUET = "parquet"
    VORTEX = "vortex"
    WARC = "warc"  # web crawls: WARC and WET files (zephyr.io.warc)


_EXTENSIONS = {
    ".jsonl": FileFormat.JSONL, ".ndjson": FileFormat.JSONL, ".json": FileFormat.JSONL, ".parquet": FileFormat.PARQUET,
    ".vortex": FileFormat.VORTEX, ".warc": FileFormat.WARC, ".wet": FileFormat.WARC,
}


def format_for(path: str) -> FileFormat:
    """The format a path's extension names, under any compression suffix, case-insensitive.

    The one format detector: `load_file()`, the planner's checks and the training reader
    (`marin.training.data`) all ask it, so what one reads the others read. `.parquet` under a
    compression suffix is Parquet (its pages are compressed inside; zephyr writes such names
    as plain Parquet).

    Raises:
        ValueError: naming the path and the known extensions.
    """
    base = strip_compression_suffix(path).lower()
    for ext, fmt in _EXTENSIONS.items():
        if base.endswith(ext):
            return fmt
    raise ValueError(f"Cannot tell the format of {path!r} from its extension (Unsupported extension); known: "
                     f"{', '.join(_EXTENSIONS)}, each optionally compressed ({', '.join(COMPRESSION_SUFFIXES)})")
