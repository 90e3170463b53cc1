"""The Arrow schema of a Parquet or Vortex file, from its footer: what the planner checks column
names against before anything runs (`zephyr.plan.column_check`)."""

from __future__ import annotations

from typing import Any

from zephyr.io.files import url_to_fs
from zephyr.io.formats import FileFormat
from zephyr.io.vortex import read_vortex_schema

__all__ = ["read_file_schema"]


def read_file_schema(path: str, fmt: FileFormat) -> Any:
    """The `pyarrow.Schema` of the Parquet or Vortex file `path` (reads its footer only)."""
    if fmt is FileFormat.VORTEX:
        return read_vortex_schema(path)
    if fmt is not FileFormat.PARQUET:
        raise ValueError(f"{path}: only Parquet and Vortex files carry a schema, not {fmt.value}")
    import pyarrow.parquet as pq

    fs, fs_path = url_to_fs(path)
    with fs.open(fs_path, "rb") as f:
        return pq.read_schema(f)
