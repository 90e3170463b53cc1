"""File I/O for Zephyr: fsspec paths, compression by extension, atomic outputs, JSONL and Parquet."""

from zephyr.io.binary import write_binary_file
from zephyr.io.compression import Codec, CorruptInputError, TruncatedInputError, codec_for
from zephyr.io.files import atomic_write, exists, expand_glob, open_input, open_output
from zephyr.io.jsonl import BadRecordError, read_jsonl, write_jsonl_file
from zephyr.io.parquet import read_parquet, write_parquet_file
from zephyr.io.records import UnwritableRecordError

__all__ = [
    "BadRecordError",
    "Codec",
    "CorruptInputError",
    "TruncatedInputError",
    "UnwritableRecordError",
    "atomic_write",
    "codec_for",
    "exists",
    "expand_glob",
    "open_input",
    "open_output",
    "read_jsonl",
    "read_parquet",
    "write_binary_file",
    "write_jsonl_file",
    "write_parquet_file",
]
