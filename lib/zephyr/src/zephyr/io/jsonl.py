"""JSON Lines: streaming reader with line-numbered errors, streaming writer (orjson)."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

import orjson

from zephyr.io.compression import CorruptInputError, TruncatedInputError
from zephyr.io.files import open_input, open_output
from zephyr.json_records import JsonLines

__all__ = ["BadRecordError", "read_jsonl", "write_jsonl_file"]

_BLOCK = 256 * 1024  # bytes of lines decoded per orjson batch


class BadRecordError(ValueError):
    """A record that cannot be decoded; names the file and the 1-based line number."""

    def __init__(self, path: str, line: int, reason: str):
        super().__init__(f"{path}:{line}: {reason}")
        self.path = path
        self.line = line
        self.reason = reason

    def __reduce__(self):
        return (BadRecordError, (self.path, self.line, self.reason))


def read_jsonl(path: str, on_bad_record: str = "raise") -> Iterator[Any]:
    """Yield the JSON value of each non-blank line of `path` (compression by extension).

    Streams: holds one block of lines (about `_BLOCK` bytes, or one longer line) at a time,
    decoded with one `map(orjson.loads, ...)` per block. A line that is not valid JSON (or
    not UTF-8) raises BadRecordError naming the file and line; with `on_bad_record="skip"` it
    is skipped and counted under the `zephyr/bad_records` counter instead. Truncated
    compressed input always raises (TruncatedInputError, naming the file and the last
    complete line).
    """
    if on_bad_record not in ("raise", "skip"):
        raise ValueError(f"on_bad_record must be 'raise' or 'skip', got {on_bad_record!r}")
    from zephyr import counters

    line_no = 0
    read = 0
    with open_input(path) as reader:
        try:
            while block := reader.read(_BLOCK):
                if not block.endswith(b"\n"):
                    block += reader.readline()  # finish the last line (however long), or EOF
                read += len(block)
                lines = block.split(b"\n")
                if block.endswith(b"\n"):
                    lines.pop()  # split leaves an empty piece after the last newline
                try:
                    values = list(map(orjson.loads, lines))
                except orjson.JSONDecodeError:  # a blank or bad line: find it line by line
                    values = _decode_lines(lines, path, line_no, on_bad_record)
                line_no += len(lines)
                yield from values
        except (TruncatedInputError, CorruptInputError) as e:
            raise type(e)(f"{path}: {e} (after line {line_no})") from e
        finally:
            counters.increment("zephyr/bytes_read", read)


def _decode_lines(lines: list[bytes], path: str, line_no: int, on_bad_record: str) -> list:
    """The slow path of a block: skip blank lines; raise (or count) bad ones by number."""
    from zephyr import counters

    values = []
    for line_no, line in enumerate(lines, start=line_no + 1):
        if not line.strip():
            continue
        try:
            values.append(orjson.loads(line))
        except orjson.JSONDecodeError as e:
            if on_bad_record == "skip":
                counters.increment("zephyr/bad_records")
                continue
            raise BadRecordError(path, line_no, f"malformed JSON: {e}; line starts {line[:80]!r}") from None
    return values


def write_jsonl_file(items: Iterable[Any], path: str, *, remove_stale: bool = True) -> int:
    """Write items as JSON lines to `path` atomically; returns the number written.

    Items that still hold their JSON lines (a shuffle's `JsonLines`) are written by copying
    those bytes, which are what encoding the items would give."""
    count = 0
    dumps = orjson.dumps
    with open_output(path, remove_stale=remove_stale) as out:
        if isinstance(items, JsonLines):
            for block, n in items.blocks():
                out.write(block)
                count += n
            return count
        for item in items:
            out.write(dumps(item, option=orjson.OPT_APPEND_NEWLINE))
            count += 1
    return count
