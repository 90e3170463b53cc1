"""Reading into the engine: JSON lines and Parquet row batches as Frames.

JSON lines are parsed by orjson, the record path's own parser (`zephyr.io.jsonl`): it is what
makes every value exact (Polars' JSON reader turns a number in a string column into a string,
an integer beyond 64 bits into null and a lone surrogate escape into NUL; see
benchmarks/README.md), it reads any formatting of the lines at one speed, and its errors name
the file and line. Parsing costs about what Polars' parser costs on the same lines; everything
after it (expressions, keys, partitioning, writing) is native. Only the columns the stage's
ops read become Polars columns; each row keeps its line, so a row no op changes is written as
it was read. Parquet row batches come from `zephyr.io.parquet` (its projection, filter and
row-group pushdown) and are whole rows already.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import polars as pl
import pyarrow as pa

from zephyr import counters
from zephyr.engine.frame import PYTHON_COLUMN, Frame, typed_series
from zephyr.io.jsonl import decode_block_lines, jsonl_blocks, span_label

__all__ = ["ALL_COLUMNS", "block_bytes", "frame_of_table", "jsonl_frames"]

MIN_BLOCK = 1024 * 1024
MAX_BLOCK = 8 * 1024 * 1024
DEFAULT_BLOCK = 4 * 1024 * 1024
ALL_COLUMNS = None  # `needed` when every field must become a column


def block_bytes(memory: int | None) -> int:
    """Bytes of JSON lines per block: a 64th of the task's memory, within [1 MiB, 8 MiB]. A block
    is held a few times over (its bytes, its records as Python objects, its columns, each op's
    output: about 5x); each Polars call costs ~0.1 ms however small its frame, which 1 MiB blocks
    of short lines (3,400 rows) would pay five times per block."""
    return DEFAULT_BLOCK if not memory else min(MAX_BLOCK, max(MIN_BLOCK, memory // 64))


def jsonl_frames(path: str, on_bad_record: str, size: int, needed: frozenset | None,
                 span: tuple[int, int] | None = None) -> Iterator[Frame]:
    """The blocks of a JSON-lines file (or of the lines starting in a `span` of its bytes) as
    Frames holding the `needed` columns typed."""
    where = span_label(path, span)
    for block, line_no in jsonl_blocks(path, size, span):
        records, kept = decode_block_lines(block, where, line_no, on_bad_record)
        if not records:
            continue
        counters.increment("zephyr/engine_blocks")
        lines = _lines_of_block(block) if kept is None else pa.array([line + b"\n" for line in kept], pa.large_binary())
        yield _frame_of_records(records, lines, needed)


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
    return Frame(pl.DataFrame(typed), len(records), lines=lines, base=records, untyped=untyped, whole=whole,
                 order=tuple(names) if whole else ())


def _lines_of_block(block: bytes) -> pa.Array:
    """Each line of `block` with its newline, as a large_binary array over the block's bytes."""
    if not block.endswith(b"\n"):
        block += b"\n"
    ends = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10) + 1
    offsets = np.concatenate(([0], ends)).astype(np.int64)
    return pa.LargeBinaryArray.from_buffers(pa.large_binary(), len(ends), [None, pa.py_buffer(offsets), pa.py_buffer(block)])


def frame_of_table(table: pa.Table) -> Frame:
    """Whole rows from Arrow (a Parquet row batch, a `map_batches` result) as a complete Frame."""
    return Frame(pl.from_arrow(table) if table.num_columns else pl.DataFrame(), table.num_rows)
