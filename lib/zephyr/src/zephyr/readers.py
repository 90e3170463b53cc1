"""Public readers, at the reference project's module path (`zephyr.readers`).

Plain functions usable anywhere, inside a `flat_map` too: `load_file(path_or_spec)` and the
per-format loaders, each yielding a file's records (an `InputFileSpec` narrows it to columns, a
row range and a filter). The implementations live by layer: format detection in
`zephyr.io.formats`, the loaders in `zephyr.io.load`, a shard's reading of a Dataset load op in
`zephyr.execution.loaders`.
"""

from zephyr.io.formats import DEFAULT_FILE_PATH_COLUMN, FileFormat, format_for
from zephyr.io.load import InputFileSpec, iter_parquet_row_groups, load_file, load_jsonl, load_parquet, load_vortex, load_warc

__all__ = [
    "DEFAULT_FILE_PATH_COLUMN", "FileFormat", "InputFileSpec", "format_for", "iter_parquet_row_groups", "load_file",
    "load_jsonl", "load_parquet", "load_vortex", "load_warc",
]
