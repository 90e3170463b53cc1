"""Reading into the engine: JSON lines and Parquet row batches as Frames.

Only the columns the stage's ops read are read from JSON lines, natively by Arrow's JSON
reader where that gives exactly what orjson (the record path's parser) gives
(`zephyr.engine.json_columns`); a block it cannot read exactly is parsed by orjson as the record
path parses it (its errors name the file and line), counted and told. Each row keeps its line
(its JSON: as on the record path, a blank line is skipped and the whitespace around a line, a
CRLF's CR too, dropped) and the line's number, so a row no op changes is written as it was
read, and its record is parsed from that line only when something asks for records
(`Frame.base`, whose errors name the line). Parquet row batches come from `zephyr.io.parquet` (its projection, filter and
row-group pushdown) and are whole rows already.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa

from zephyr import counters
from zephyr.engine.frame import PYTHON_COLUMN, Frame, typed_series
from zephyr.engine.json_columns import arrow_types, read_columns
from zephyr.io.jsonl import decode_block_lines, jsonl_blocks, span_label

__all__ = ["ALL_COLUMNS", "SCAN_FALLBACKS", "block_bytes", "frame_of_table", "jsonl_frames"]

logger = logging.getLogger("zephyr")
SCAN_FALLBACKS = "zephyr/engine_scan_fallbacks"  # blocks the native scan could not read exactly

MIN_BLOCK = 1024 * 1024
MAX_BLOCK = 8 * 1024 * 1024
DEFAULT_BLOCK = 4 * 1024 * 1024
ALL_COLUMNS = None  # `needed` when every field must become a column
_JSON_SPACE = b" \t\r"  # whitespace orjson takes around a line's value (a line's own newline aside)


def block_bytes(memory: int | None) -> int:
    """Bytes of JSON lines per block: a 64th of the task's memory, within [1 MiB, 8 MiB]. A block
    is held a few times over (its bytes, its records as Python objects, its columns, each op's
    output: about 5x); each Polars call costs ~0.1 ms however small its frame, which 1 MiB blocks
    of short lines (3,400 rows) would pay five times per block."""
    return DEFAULT_BLOCK if not memory else min(MAX_BLOCK, max(MIN_BLOCK, memory // 64))


def jsonl_frames(path: str, on_bad_record: str, size: int, needed: frozenset | None,
                 span: tuple[int, int] | None = None) -> Iterator[Frame]:
    """The blocks of a JSON-lines file (or of the lines starting in a `span` of its bytes) as
    Frames holding the `needed` columns typed: read natively where that is exact
    (`zephyr.engine.json_columns`), else by orjson, counted in `zephyr/engine_scan_fallbacks`
    and told once per file with the reason."""
    where = span_label(path, span)
    types: dict = {}  # column -> Arrow type, from the blocks before
    told = False
    for block, line_no in jsonl_blocks(path, size, span):
        if not block.endswith(b"\n"):
            block += b"\n"
        text, offsets, numbers = _record_lines(block, line_no)
        lines = _lines_array(text, offsets)
        frame = None
        if needed is not None and len(lines):
            columns = read_columns(text, offsets[:-1], sorted(needed), types)
            if isinstance(columns, str):
                counters.increment(SCAN_FALLBACKS)
                if not told:
                    logger.warning("%s (a block from line %d): the native scan cannot read it exactly: %s; "
                                   "such blocks are parsed by orjson", where, line_no + 1, columns)
                    told = True
            else:
                frame = Frame(columns, len(lines), lines=lines, where=where, numbers=numbers)
        if frame is None:
            frame = _frame_of_block(block, lines, where, line_no, on_bad_record, needed)
            if frame is None:
                continue
        arrow_types(frame.df, frame.untyped, types)
        counters.increment("zephyr/engine_blocks")
        yield frame


def _frame_of_block(block: bytes, lines: pa.Array, where: str, line_no: int, on_bad_record: str,
                    needed: frozenset | None) -> Frame | None:
    """The block's Frame from its records as orjson parses them (the record path's parser);
    `lines`: the block's `_record_lines`."""
    records, kept = decode_block_lines(block, where, line_no, on_bad_record)
    if not records:
        return None
    if kept is not None:  # a line skipped
        lines = pa.array([line.strip(_JSON_SPACE) + b"\n" for line in kept], pa.large_binary())
    return _frame_of_records(records, lines, needed)


def _frame_of_records(records: list, lines: pa.Array, needed: frozenset | None) -> Frame:
    names = sorted(needed) if needed is not None else list(dict.fromkeys(k for r in records for k in r))
    typed, untyped = [], {}
    for name in names:
        values = [r.get(name) for r in records]
        series = typed_series(name, values)
        if series is None:
            counters.increment(PYTHON_COLUMN + name)
            untyped[name] = values
        else:
            typed.append(series)
    whole = needed is None
    return Frame(pl.DataFrame(typed), len(records), lines=lines, parsed=records, untyped=untyped, whole=whole,
                 order=tuple(names) if whole else ())


def _record_lines(block: bytes, line_no: int) -> tuple[bytes, np.ndarray, np.ndarray]:
    """The lines of `block` (whole lines, the first being line `line_no + 1`) the record path
    reads a record from, each as its JSON and a newline: a blank line skipped, the whitespace
    around a line (a CRLF's CR too) dropped, as orjson ignores them. (Their bytes, the offset
    of each line and their length, each one's line number.)"""
    data = np.frombuffer(block, dtype=np.uint8)
    ends = np.flatnonzero(data == 10) + 1
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    if (data[offsets[:-1]] == ord("{")).all() and (data[ends - 2] == ord("}")).all():
        return block, offsets, np.arange(line_no + 1, line_no + len(offsets), dtype=np.int64)
    kept = [(n, line.strip(_JSON_SPACE)) for n, line in enumerate(block.split(b"\n")[:-1], line_no + 1) if line.strip()]
    offsets = np.cumsum([0] + [len(line) + 1 for _, line in kept], dtype=np.int64)
    return b"".join(line + b"\n" for _, line in kept), offsets, np.array([n for n, _ in kept], dtype=np.int64)


def _lines_array(block: bytes, offsets: np.ndarray) -> pa.Array:
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(block)])


def frame_of_table(table: pa.Table) -> Frame:
    """Whole rows from Arrow (a Parquet row batch, a `map_batches` result) as a complete Frame."""
    return Frame(pl.from_arrow(table) if table.num_columns else pl.DataFrame(), table.num_rows)
