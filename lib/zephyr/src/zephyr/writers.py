"""One-file writers with the reference project's signatures: each writes records to one path,
atomically, and returns `{"path": path, "count": records written}`.

    from zephyr.writers import write_jsonl_file, write_parquet_file, write_vortex_file
    write_parquet_file(records, "out/part-0.parquet")  # {"path": "out/part-0.parquet", "count": 3}

The Dataset writers (`write_jsonl`, ...) call the same code (`zephyr.io`), whose functions
return the bare count; types, compression and refusals are documented there.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

from zephyr.io import binary, jsonl, parquet, vortex
from zephyr.io.parquet_schema import SchemaConflict, arrow_schema, infer_records

__all__ = ["infer_arrow_schema", "write_binary_file", "write_jsonl_file", "write_parquet_file", "write_vortex_file"]


def infer_arrow_schema(records: Iterable[dict[str, Any]]) -> Any:
    """The `pyarrow.Schema` `write_parquet_file` would give these records (exact widening: null +
    T -> T, int -> float within +-2**53, structs unioned); a field of all nulls is `null`.

    Raises:
        pyarrow.ArrowInvalid: values no one type holds exactly (an int and a str, ...), naming the field.
    """
    import pyarrow as pa

    try:
        return arrow_schema(infer_records(list(records)))
    except SchemaConflict as e:
        raise pa.ArrowInvalid(f"field {e.field!r}: {e.reason}") from None


def write_jsonl_file(records: Iterable[Any], output_path: str) -> dict:
    """JSON Lines, compressed by extension (`zephyr.io.jsonl.write_jsonl_file`)."""
    return {"path": output_path, "count": jsonl.write_jsonl_file(records, output_path)}


def write_parquet_file(records: Iterable[Any], output_path: str, *, schema: Any = None) -> dict:
    """Parquet of dict or dataclass records (`zephyr.io.parquet.write_parquet_file`)."""
    return {"path": output_path, "count": parquet.write_parquet_file(records, output_path, schema)}


def write_vortex_file(records: Iterable[Any], output_path: str, *, schema: Any = None) -> dict:
    """Vortex of dict or dataclass records (`zephyr.io.vortex.write_vortex_file`)."""
    return {"path": output_path, "count": vortex.write_vortex_file(records, output_path, schema)}


def write_binary_file(records: Iterable[bytes], output_path: str) -> dict:
    """Bytes items back to back, unframed (`zephyr.io.binary.write_binary_file`)."""
    return {"path": output_path, "count": binary.write_binary_file(records, output_path)}
