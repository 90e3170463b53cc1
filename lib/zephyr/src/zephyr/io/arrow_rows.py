"""Pieces of a shard's stream on the batch path: Arrow `Rows`, or lists of Python records.

A block of JSON lines becomes `Rows` when pyarrow's JSON reader parses it into a table that,
written back as JSON lines (`encode.json_lines_of`), gives the block's bytes exactly. Then
every line has the same keys in the same order, no key is missing, each value has one Arrow
type that `to_pylist` turns into what orjson would have read (str, int, bool, None), and each
line is already what the record path would write for it. Any other block (blank or bad lines,
floats, nested values, integers beyond 64 bits, keys that vary, spaces, escapes written
another way) is read as records by `zephyr.io.jsonl.decode_block`, with its errors.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import numpy as np
import pyarrow as pa

from zephyr import counters
from zephyr.io.arrow_json import json_lines_of, same_bytes
from zephyr.io.jsonl import decode_block, jsonl_blocks

__all__ = ["Pieces", "Rows", "block_bytes", "read_jsonl_pieces", "records_of", "valid_rows"]

MIN_BLOCK = 256 * 1024
MAX_BLOCK = 4 * 1024 * 1024
DEFAULT_BLOCK = 1024 * 1024
LONG_LINE = 1024  # bytes per line on average above which a file is read as records


@dataclass
class Rows:
    """Rows as an Arrow table; `lines` holds each row's JSON line when known."""

    table: pa.Table
    lines: pa.Array | None = None
    plain: bool = False  # its strings hold nothing JSON escapes

    def __len__(self) -> int:
        return self.table.num_rows

    def records(self) -> list:
        return self.table.to_pylist()

    def json_lines(self) -> pa.Array | None:
        """Each row's JSON line, or None when a column's type is not written in Arrow."""
        if self.lines is None:
            self.lines = json_lines_of(self.table, self.plain)
        return self.lines


def records_of(piece: Rows | list) -> list:
    return piece.records() if isinstance(piece, Rows) else piece


def valid_rows(table: pa.Table) -> Rows | list:
    """`Rows(table)` when Arrow holds it as `to_pylist` would read it; else its records.

    Tables from outside the JSON block check (a Parquet file, a `map_batches` fn) can hold
    string values that are not UTF-8 (Parquet readers don't check; `binary.view(string)`
    doesn't either). The record path's `to_pylist` raises on them, so they must not reach a
    batch writer, which would copy the bytes out as they are. A full validation costs about
    0.1 ms per MB; a table that fails it goes through `to_pylist`, which raises the record
    path's error (or gives its records)."""
    try:
        table.validate(full=True)
    except pa.ArrowInvalid:
        counters.increment("zephyr/invalid_utf8_batches_as_records")
        return table.to_pylist()
    return Rows(table)


_first = operator.itemgetter(0)


class Pieces:
    """A shard's stream as pieces (`chunks()`), which iterates as Python records for any op
    that needs them: that is where a stage switches from batches to records."""

    def __init__(self, pieces: Iterator[Rows | list]):
        self._pieces = pieces
        self._rows = 0  # rows of the pieces handed out by chunks()
        self._records: Iterator[Any] | None = None
        self._record_count: Iterator[int] | None = None
        self._failed = False  # a batch op raised: no record of the stream's is the one at fault

    def chunks(self) -> Iterator[Rows | list]:
        pieces = iter(self._pieces)
        while True:
            try:
                piece = next(pieces)
            except StopIteration:
                return
            except Exception:
                self._failed = True
                raise
            if len(piece):
                self._rows += len(piece)
                yield piece

    def __iter__(self) -> Iterator[Any]:
        if self._records is None:
            self._record_count = itertools.count()
            records = itertools.chain.from_iterable(map(records_of, self.chunks()))
            self._records = map(_first, zip(records, self._record_count))
        return self._records

    def __next__(self) -> Any:
        """Pieces is an iterator of records too, for ops (a `map_shard` function) that call `next`."""
        return next(iter(self))

    def counted(self) -> Iterator[int]:
        """An iterator whose next value is how many rows have been handed on so far (0 once a
        batch op failed, so that `failed_record` names none: the rows it was given are not
        the ones counted)."""
        return iter(lambda: 0 if self._failed else self._rows if self._record_count is None else next(self._record_count), None)


def block_bytes(memory: int | None) -> int:
    """Bytes of JSON lines per block: a 256th of the task's memory, within [256 KiB, 4 MiB].

    A block is held several times over (its bytes, the table, its lines, each op's output),
    and pyarrow's allocator keeps what it freed for a while: with `memory=256MiB`, 4 MiB
    blocks raised a W1 task's peak RSS by 95 MiB over its start, 1 MiB blocks by 50 MiB (the
    record path: 22), at the same CPU."""
    return DEFAULT_BLOCK if not memory else min(MAX_BLOCK, max(MIN_BLOCK, memory // 256))


def read_jsonl_pieces(path: str, on_bad_record: str, size: int) -> Iterator[Rows | list]:
    """The blocks of a JSON-lines file: `Rows` where exact (see the module doc), else records.

    A file whose first block has long lines (over `LONG_LINE` bytes on average) is read as
    records throughout: there orjson parses faster than pyarrow's JSON reader, and the batch
    path's check copies every byte again (W1's 1.1 KB documents: 4.0-4.7 µs/doc to parse in
    pyarrow, 3.4-3.5 in orjson, plus ~1.2 for the check; 300-byte documents: 0.65 against 0.7+).
    """
    long_lines = None
    for block, line_no in jsonl_blocks(path, size):
        if long_lines is None:
            long_lines = len(block) > LONG_LINE * max(1, block.count(b"\n"))
        rows = None if long_lines else rows_of_block(block)
        counters.increment("zephyr/blocks_as_batches" if rows is not None else "zephyr/blocks_as_records")
        yield rows if rows is not None else decode_block(block, path, line_no, on_bad_record)


def rows_of_block(block: bytes) -> Rows | None:
    import pyarrow.json as pj

    try:
        table = pj.read_json(pa.BufferReader(block), read_options=pj.ReadOptions(use_threads=False, block_size=len(block) + 1))
        # pyarrow's reader takes strings that are not UTF-8 (orjson refuses them: a bad line)
        table.validate(full=True)
        table.column_names  # keys that are not UTF-8 fail here
    except (pa.ArrowException, ValueError):  # UnicodeDecodeError is a ValueError
        return None
    # no backslash and no control byte but a newline per row: no string holds anything to escape
    # (exact once the block is accepted below: then it has exactly one newline per row)
    plain = b"\\" not in block and _control_bytes(block) == table.num_rows
    lines = json_lines_of(table, plain)
    if lines is None or not same_bytes(lines, block):
        return None
    return Rows(table, lines, plain)


def _control_bytes(block: bytes) -> int:
    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) < 32))
