"""Raw bytes output: `write_binary` writes each item's bytes back to back, with no framing."""

from __future__ import annotations

from collections.abc import Iterable

from zephyr.io.files import open_output

__all__ = ["write_binary_file"]


def write_binary_file(items: Iterable[bytes], path: str, *, remove_stale: bool = True) -> int:
    """Write the bytes items to `path` atomically (compressed by extension); returns the count.

    Raises TypeError naming the record and the path for an item that is not bytes-like.
    """
    count = 0
    with open_output(path, remove_stale=remove_stale) as out:
        for item in items:
            if not isinstance(item, (bytes, bytearray, memoryview)):
                raise TypeError(f"{path}: write_binary needs bytes items; record {count} is {type(item).__name__}: {item!r:.80}")
            out.write(item)
            count += 1
    return count
