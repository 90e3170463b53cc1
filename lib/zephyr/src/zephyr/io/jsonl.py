"""JSON Lines: streaming reader with line-numbered errors, streaming writer (orjson), both exact.

Reading: every line must hold a JSON object (what `load_jsonl` promises: dict records); numbers
read as Python reads them, integers of any size included (orjson alone would turn an integer
beyond 64 bits into a float). Writing: a record is written only when reading its line back gives
it unchanged, up to the conversions JSON implies (see `write_jsonl_file`); anything else fails
before the output appears (`UnwritableRecordError`).
"""

from __future__ import annotations

import collections
import dataclasses
import io
import itertools
import json
import math
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import numpy as np
import orjson

from zephyr.io.json_records import JsonLines, first_non_object, json_exact, line_bytes
from zephyr.io.compression import Codec, CorruptInputError, TruncatedInputError, codec_for
from zephyr.io.files import counted_input, open_counted_input, open_output
from zephyr.io.records import UnwritableRecordError, field_path
from zephyr import counters

__all__ = ["BadRecordError", "decode_block", "decode_block_lines", "encode_records", "json_values", "jsonl_blocks", "read_jsonl",
           "read_jsonl_numbered", "span_label", "write_jsonl_file"]

_BLOCK = 256 * 1024  # bytes of lines decoded per orjson batch
_CHUNK = 1024  # records encoded (and checked) per write
_SPAN_BUFFER = 64 * 1024  # a span's reader: readline() after a seek reads this much at a time
# 19+ digits in a row: where orjson may read an integer beyond 64 bits as a float (the run may
# also be inside a string or a float; such lines are merely decoded twice). Found by mapping
# every digit to "0" and searching for 19 of them (~1.2 GB/s, where a regex manages ~100 MB/s),
# after a sample of every 9th byte: 19 bytes in a row hold two consecutive multiples of 9, so
# only where two consecutive samples are digits can such a run be (~3 GB/s on web text).
_DIGITS_TO_ZERO = bytes.maketrans(b"123456789", b"000000000")
_LONG_RUN = b"0" * 19
_STRIDE = 9
_NO_DEFAULT = itertools.repeat(None)
_LINE_OPTION = itertools.repeat(orjson.OPT_APPEND_NEWLINE)


class BadRecordError(ValueError):
    """A record that cannot be decoded; names the file and the 1-based line number."""

    def __init__(self, path: str, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason

    def __reduce__(self):
        return (BadRecordError, (self.path, self.line, self.reason))


def read_jsonl(path: str, on_bad_record: str = "raise", span: tuple[int, int] | None = None) -> Iterator[dict]:
    """Yield the JSON object of each non-blank line of `path` (compression by extension).

    Streams: holds one block of lines (about `_BLOCK` bytes, or one longer line) at a time,
    decoded with one `map(orjson.loads, ...)` per block; the few lines holding a run of 19 or
    more digits are decoded again with the stdlib `json`, which keeps integers beyond 64 bits
    exact (floats parse to the same value either way). A line that is not valid JSON, not
    UTF-8, or not an object (an array, a string, a number, null) raises BadRecordError naming
    the file and line; with `on_bad_record="skip"` it is skipped and counted under the
    `zephyr/bad_records` counter instead. Truncated compressed input always raises
    (TruncatedInputError, naming the file and the last complete line). With `span=(start, end)`
    (an uncompressed file), only the lines that start in those bytes (`jsonl_blocks`); errors
    then name the span and the line in it (`a.jsonl [bytes 1000-2000]:3`).
    """
    if on_bad_record not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
    where = span_label(path, span)
    for block, line_no in jsonl_blocks(path, span=span):
        yield from decode_block(block, where, line_no, on_bad_record)


def span_label(path: str, span: tuple[int, int] | None) -> str:
    """How errors name a file, or a span of it (lines then count from the span's first)."""
    return path if span is None else f"{path} [bytes {span[0]}-{span[1]}]"


def jsonl_blocks(path: str, size: int = _BLOCK, span: tuple[int, int] | None = None) -> Iterator[tuple[bytes, int]]:
    """(block, lines before it) for each block of whole lines of `path` (about `size` bytes,
    or one longer line). Counts `zephyr/bytes_read` (the file's bytes fetched, compressed as
    stored) and `zephyr/bytes_decoded` (the lines' bytes after decompression). Truncated or
    corrupt compressed input raises naming the file and the last line of the blocks before.

    With `span=(start, end)`, the lines of an uncompressed file that start in bytes [start,
    end), in large sequential reads: from the first line start at or after `start` (the byte
    before it is read to tell) to the end of the line holding byte `end - 1`. Spans that tile
    the file give each line once. Lines count from the span's first."""
    if span is not None:
        yield from _span_blocks(path, size, *span)
        return
    line_no = 0
    decoded = 0
    with open_counted_input(path) as reader:
        try:
            while block := reader.read(size):
                if not block.endswith(b"\n"):
                    block += reader.readline()  # finish the last line (however long), or EOF
                decoded += len(block)
                yield block, line_no
                line_no += _newlines(block) + (not block.endswith(b"\n"))
        except (TruncatedInputError, CorruptInputError) as e:
            raise type(e)(f"{path}: {e} (after line {line_no})") from e
        finally:
            counters.increment("zephyr/bytes_decoded", decoded)


def _span_blocks(path: str, size: int, start: int, end: int) -> Iterator[tuple[bytes, int]]:
    """`jsonl_blocks` of a span (see there)."""
    if codec_for(path) is not Codec.NONE:
        raise ValueError(f"{path}: a compressed file cannot be read from byte {start}; only whole (a span is for uncompressed files)")
    line_no = decoded = 0
    position = start
    with counted_input(path, "sequential") as raw:
        reader = io.BufferedReader(raw, buffer_size=_SPAN_BUFFER)
        try:
            if start > 0:  # the line holding byte start - 1 belongs to the span before
                reader.seek(start - 1)
                position = start - 1 + len(reader.readline())
            while position < end and (block := reader.read(min(size, end - position))):
                if not block.endswith(b"\n"):
                    block += reader.readline()  # the line that holds byte end - 1 is this span's
                position += len(block)
                decoded += len(block)
                yield block, line_no
                line_no += _newlines(block) + (not block.endswith(b"\n"))
        finally:
            counters.increment("zephyr/bytes_decoded", decoded)


def _newlines(block: bytes) -> int:
    """`block.count(b"\n")`, three times faster (NumPy compares 32 bytes at a time)."""
    return int(np.count_nonzero(np.frombuffer(block, dtype=np.uint8) == 10))


def decode_block(block: bytes, path: str, line_no: int, on_bad_record: str = "raise") -> list:
    """The records of a block of lines (the first being line `line_no + 1`), as `read_jsonl` reads them."""
    return decode_block_lines(block, path, line_no, on_bad_record)[0]


def decode_block_lines(block: bytes, path: str, line_no: int, on_bad_record: str = "raise") -> tuple[list, list | None]:
    """`decode_block`'s records, and the lines they were read from: None when that is every
    line of the block, in order (no blank line and none skipped), else the list of them."""
    lines = block.split(b"\n")
    if block.endswith(b"\n"):
        lines.pop()  # split leaves an empty piece after the last newline
    try:
        values = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:  # a blank or bad line: found line by line
        values = None
    if values is None or _long_digits(block) or set(map(type, values)) != {dict}:
        kept: list = []
        values = _decode_lines(lines, path, line_no, on_bad_record, kept)
        return values, (None if len(kept) == len(lines) else kept)
    return values, None


def json_values(lines: list[bytes], where: str = "", numbers: Sequence[int] | None = None) -> list:
    """The JSON value of each line (any JSON value), integers beyond 64 bits read exactly (a line
    an engine copied from its input may hold one; orjson alone would read it as a float). With
    `numbers` (each line's number in the file `where`), a line orjson refuses raises
    BadRecordError naming it."""
    try:
        values = list(map(orjson.loads, lines))
    except orjson.JSONDecodeError:
        if numbers is None:
            raise
        for line, number in zip(lines, numbers):
            try:
                orjson.loads(line)
            except orjson.JSONDecodeError as e:
                raise BadRecordError(where, int(number), _malformed(line, e)) from None
        raise
    if _long_digits(b"".join(lines)):  # rare: then find the lines
        for i, line in enumerate(lines):
            if _long_digits(line):
                values[i] = json.loads(line)
    return values


def _long_digits(data: bytes) -> bool:
    """Whether `data` holds 19 or more ASCII digits in a row."""
    if len(data) < 64:
        return _LONG_RUN in data.translate(_DIGITS_TO_ZERO)
    digit = (np.frombuffer(data, dtype=np.uint8)[::_STRIDE] - np.uint8(48)) < 10  # bytes below "0" wrap past 9
    for k in np.flatnonzero(digit[:-1] & digit[1:]).tolist():
        at = k * _STRIDE  # a run of 19 through `at` lies within 18 bytes of it
        if _LONG_RUN in data[max(0, at - 18) : at + _STRIDE + 19].translate(_DIGITS_TO_ZERO):
            return True
    return False


def _decode_lines(lines: list[bytes], path: str, line_no: int, on_bad_record: str, kept: list | None = None) -> list:
    """The slow path of a block: skip blank lines, decode long integers exactly, raise (or
    count) bad lines by number. `kept` gets the lines the records were read from."""
    values = []
    for _, value, line in _numbered_lines(lines, path, line_no, on_bad_record):
        values.append(value)
        if kept is not None:
            kept.append(line)
    return values


def _numbered_lines(lines: list[bytes], path: str, line_no: int, on_bad_record: str) -> Iterator[tuple[int, dict, bytes]]:
    """(line number, record, line) of each line that holds a record (see `_decode_lines`)."""
    for line_no, line in enumerate(lines, start=line_no + 1):
        if not line.strip():
            continue
        try:
            value = orjson.loads(line)  # also validates what the stdlib would let through (NaN)
        except orjson.JSONDecodeError as e:
            reason = _malformed(line, e)
        else:
            if type(value) is dict:
                yield line_no, json.loads(line) if _long_digits(line) else value, line
                continue
            reason = f"expected a JSON object, got {type(value).__name__}; line starts {line[:80]!r}"
        if on_bad_record == "skip":
            counters.increment("zephyr/bad_records")
            continue
        raise BadRecordError(path, line_no, reason)


def _malformed(line: bytes, error: orjson.JSONDecodeError) -> str:
    return f"malformed JSON: {error}; line starts {line[:80]!r}"


def read_jsonl_numbered(path: str, on_bad_record: str = "raise", span: tuple[int, int] | None = None) -> Iterator[tuple[int, dict]]:
    """(1-based line number, record) for each record `read_jsonl` yields, in order: slower (a
    line at a time), for naming the line a record came from (`zephyr.execution.replay`).
    With a `span`, lines count from the span's first, as `read_jsonl`'s errors do."""
    where = span_label(path, span)
    for block, line_no in jsonl_blocks(path, span=span):
        lines = block.split(b"\n")
        if block.endswith(b"\n"):
            lines.pop()
        yield from ((number, value) for number, value, _ in _numbered_lines(lines, where, line_no, on_bad_record))


def write_jsonl_file(items: Iterable[Any], path: str, *, remove_stale: bool = True) -> int:
    """Write items as JSON lines to `path` atomically; returns the number written.

    Each item must be a JSON object (a dict or a dataclass: `read_jsonl` reads only objects)
    and read back unchanged, but for what JSON implies: a tuple reads back as a list, a
    dataclass as the dict of its fields, a str or dict subclass as a plain str or dict.
    Anything else JSON would change (NaN and infinities, which orjson writes as null; bytes;
    non-str dict keys; lone surrogates; datetimes, enums and other objects) raises
    UnwritableRecordError naming the record, the field and the value, and no file appears.
    Integers of any size are written exactly (those beyond 64 bits by the stdlib encoder). Items that still hold their JSON lines (a shuffle's `JsonLines`) are
    written by copying those bytes, which are what encoding the items would give.
    """
    count = 0
    with open_output(path, remove_stale=remove_stale) as out:
        if isinstance(items, JsonLines):
            for lines in items.blocks():
                if (row := first_non_object(lines)) is not None:
                    raise UnwritableRecordError(path, count + row, "", _not_an_object(orjson.loads(lines[row].as_py())))
                out.write(line_bytes(lines))
                count += len(lines)
            return count
        iterator = iter(items)
        while chunk := list(itertools.islice(iterator, _CHUNK)):
            out.write(encode_records(chunk, path, count))
            count += len(chunk)
    return count


def encode_records(chunk: list, path: str, offset: int) -> bytearray:
    """The chunk's JSON lines, checked in bulk (`json_exact`); a chunk that fails the bulk
    check is walked record by record to find what JSON would change, or to accept it."""
    buffer = bytearray()
    try:
        collections.deque(map(buffer.extend, map(orjson.dumps, chunk, _NO_DEFAULT, _LINE_OPTION)), maxlen=0)
        if json_exact(chunk, check_keys=False) and set(map(type, chunk)) <= _DICT:
            return buffer
    except orjson.JSONEncodeError:
        pass
    buffer = bytearray()
    for i, item in enumerate(chunk):
        problem = ("", _not_an_object(item)) if not _is_object(item) else _changed_by_json(item, "")
        if problem is not None:
            raise UnwritableRecordError(path, offset + i, *problem)
        try:
            buffer += orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE)
        except orjson.JSONEncodeError as e:
            if "64-bit" not in str(e):  # cycles, nesting too deep
                raise UnwritableRecordError(path, offset + i, "", f"cannot be written as JSON: {e}") from None
            # integers beyond 64 bits: the stdlib writes them exactly (and `read_jsonl` reads them so)
            buffer += json.dumps(item, ensure_ascii=False, separators=(",", ":"), default=_fields_of).encode() + b"\n"
    return buffer


_DICT = frozenset({dict})


def _is_object(item: Any) -> bool:
    """Whether JSON writes `item` as an object: a dict, or a dataclass (as the dict of its fields)."""
    return isinstance(item, dict) or (dataclasses.is_dataclass(item) and not isinstance(item, type))


def _not_an_object(item: Any) -> str:
    kind = "None" if item is None else type(item).__name__
    return (f"the item is {kind} {item!r:.40}, not a dict: load_jsonl reads back only JSON objects, one per line "
            "(make each item a dict, e.g. .map(lambda x: {\"value\": x}))")


def _fields_of(value: Any) -> dict:
    """A dataclass as orjson writes it, for the stdlib encoder."""
    return {f.name: getattr(value, f.name) for f in dataclasses.fields(value)}


def _changed_by_json(value: Any, field: str) -> tuple[str, str] | None:
    """(field path, why) for the first value in `value` that JSON would not give back (beyond
    the conversions `write_jsonl_file` accepts), or None."""
    kind = type(value)
    if kind is bool or value is None:
        return None
    if isinstance(value, str):
        return _bad_text(value, field, "a str")
    if kind is int:
        return None  # any size: `read_jsonl` reads integers beyond 64 bits exactly
    if kind is float:
        return None if math.isfinite(value) else (field, f"float {value!r} would be written as null (JSON has no NaN or infinity)")
    if isinstance(value, dict):
        for key, item in value.items():
            if not isinstance(key, str):
                return field, f"a dict key {key!r:.40} of type {type(key).__name__} (JSON keys are strings)"
            problem = _bad_text(key, field, "a dict key") or _changed_by_json(item, field_path(field, key))
            if problem:
                return problem
        return None
    if kind is list or kind is tuple:
        for i, item in enumerate(value):
            if problem := _changed_by_json(item, field_path(field, i)):
                return problem
        return None
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return _changed_by_json(_fields_of(value), field)
    return field, f"{kind.__name__} {value!r:.40} is not JSON data (JSON has str, int, float, bool, null, lists and objects)"


def _bad_text(text: str, field: str, what: str) -> tuple[str, str] | None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return field, f"{what} {text!r:.40} holds a lone surrogate, which UTF-8 cannot encode"
    return None
