"""File I/O for Zephyr: fsspec paths, compression by extension, atomic outputs, JSONL, Parquet and WARC."""

from zephyr.io.binary import write_binary_file
from zephyr.io.compression import Codec, CorruptInputError, TruncatedInputError, codec_for
from zephyr.io.files import atomic_write, exists, expand_glob, open_input, open_output
from zephyr.io.jsonl import BadRecordError, read_jsonl, write_jsonl_file
from zephyr.io.parquet import read_parquet, write_parquet_file
from zephyr.io.records import UnwritableRecordError
from zephyr.io.warc import BadWarcRecordError, read_warc, write_warc_file

__all__ = [
    "BadRecordError",
    "BadWarcRecordError",
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
    "read_warc",
    "write_binary_file",
    "write_jsonl_file",
    "write_parquet_file",
    "write_warc_file",
]
