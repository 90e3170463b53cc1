"""Sorted run files: the bytes a scatter writes and a reduce task reads back.

A run holds one map-side buffer, sorted by (partition, hash, key bytes, sort value, position),
with each partition's records contiguous; the manifest records each partition's byte range, so
a reduce task reads only its own ranges (ranged requests: no file kept open, so thousands of
runs never hold thousands of descriptors). Two formats:

- **Arrow** (`.arrow`, columnar records): each partition is a self-contained Arrow IPC stream
  (schema message, record batches of about `BATCH_BYTES`, end marker). Buffers are LZ4
  compressed when the scratch is on an object store (fewer bytes over the network) and left
  uncompressed on a local disk, where compressing costs more CPU than it saves I/O;
  `ZEPHYR_SHUFFLE_COMPRESSION=lz4|zstd|none` overrides.
  Columns: `h` (uint64 hash), `kb` (key bytes), optionally `sv` (sort value), `pos`, then the
  payload `c0, c1, ...` (see `columnar.py`). For a partition written as several batches the
  writer reports each batch's first hash, rows and offset, so a reduce task that owns only a
  key range of a skewed partition reads only the batches that can hold it.
- **Pickle** (`.bin`, anything else): zstd frames of pickled record lists
  `(h, kb, sort value, origin shard, origin position, pickle((key, item)))`.
"""

from __future__ import annotations

import io
import os
import pickle
import struct
from collections.abc import Iterable, Iterator
from typing import Any

import numpy as np
import pyarrow as pa
import zstandard

from zephyr.io.files import url_to_fs

__all__ = ["ArrowRunWriter", "compression_for", "rows_per_batch", "read_arrow_range", "read_pickle_range", "write_pickle_frames"]

BATCH_BYTES = 1024 * 1024  # uncompressed bytes per Arrow record batch in a run
MIN_BATCH_ROWS = 1  # a batch of big records may be one record (the merge holds a batch per open run)
FRAME_TARGET = 256 * 1024  # uncompressed bytes of pickled records per zstd frame
READ_CHUNK = 256 * 1024
_LEN = struct.Struct("<I")
_EOS = b"\xff\xff\xff\xff\x00\x00\x00\x00"


def compression_for(path: str) -> str | None:
    """The IPC buffer codec for a run at `path` (see the module doc)."""
    choice = os.environ.get("ZEPHYR_SHUFFLE_COMPRESSION", "").lower()
    if choice:
        if choice not in ("lz4", "zstd", "none"):
            raise ValueError(f"ZEPHYR_SHUFFLE_COMPRESSION must be lz4, zstd or none, got {choice!r}")
        return None if choice == "none" else choice
    return None if _is_local(path) else "lz4"


def _is_local(path: str) -> bool:
    return "://" not in path or path.startswith("file://")


class ArrowRunWriter:
    """Writes a sorted table partition by partition; collects offsets and the batch index."""

    def __init__(self, f, path: str, schema: pa.Schema, num_partitions: int):
        self.f = f
        self.schema = schema
        self.schema_len = len(schema.serialize())
        self.offsets = np.zeros(num_partitions + 1, dtype=np.int64)
        self.batches: list[tuple[int, int, int, int]] = []  # (partition, first hash, rows, offset)
        self._options = pa.ipc.IpcWriteOptions(compression=compression_for(path))
        self._start = f.tell()

    def write(self, table: pa.Table, bounds: np.ndarray) -> None:
        """`bounds[p]:bounds[p+1]` are partition p's rows of `table` (sorted, without `p`)."""
        per_batch = rows_per_batch(table)
        hashes = table.column("h")
        for p in range(len(bounds) - 1):
            a, b = int(bounds[p]), int(bounds[p + 1])
            self.offsets[p] = self.f.tell() - self._start
            if a == b:
                continue
            several = b - a > per_batch
            with pa.ipc.new_stream(self.f, self.schema, options=self._options) as writer:
                for start in range(a, b, per_batch):
                    at = self.f.tell() - self._start + (self.schema_len if start == a else 0)
                    if several:
                        self.batches.append((p, hashes[start].as_py(), min(per_batch, b - start), at))
                    for batch in table.slice(start, min(per_batch, b - start)).to_batches():
                        writer.write_batch(batch)
        self.offsets[len(bounds) - 1] = self.f.tell() - self._start


def rows_per_batch(table: pa.Table) -> int:
    """Rows of `table` that make about `BATCH_BYTES` (at least MIN_BATCH_ROWS)."""
    return max(MIN_BATCH_ROWS, int(BATCH_BYTES * max(1, table.num_rows) / max(1, table.nbytes)))


class _Segments(io.RawIOBase):
    """A read-only stream over literal bytes and byte ranges of files (ranged `cat_file`)."""

    def __init__(self, segments: list):
        self._segments = segments  # each: bytes, or (path, start, end)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def _next(self) -> bool:
        while self._segments:
            segment = self._segments[0]
            if isinstance(segment, bytes):
                self._segments.pop(0)
                data = segment
            else:
                path, start, end = segment
                if start >= end:
                    self._segments.pop(0)
                    continue
                fs, fs_path = url_to_fs(path)
                data = fs.cat_file(fs_path, start=start, end=min(end, start + READ_CHUNK))
                if not data:
                    raise EOFError(f"{path}: shuffle run ends at byte {start}, before {end}")
                self._segments[0] = (path, start + len(data), end)
            if data:
                self._pending = memoryview(data)
                return True
        return False

    def readinto(self, buffer) -> int:
        if not len(self._pending) and not self._next():
            return 0
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def read_arrow_range(path: str, head: int, start: int, end: int, schema_len: int) -> Iterator[pa.RecordBatch]:
    """Record batches of one partition of an Arrow run: the stream at `head`, read from byte
    `start` (a batch boundary; `head` itself to read it all) to `end`, one batch at a time."""
    if start == end:
        return
    if _is_local(path):  # native reads
        with pa.OSFile(path.removeprefix("file://"), "rb") as f:
            f.seek(head)
            if start == head:  # the whole stream: it stops at its end marker
                yield from pa.ipc.open_stream(f)
                return
            schema = pa.ipc.read_schema(f)  # a key range: the stream's schema, then only its batches
            f.seek(start)
            while f.tell() < end:
                try:
                    message = pa.ipc.read_message(f)
                except EOFError:  # the stream's end marker
                    return
                yield pa.ipc.read_record_batch(message, schema)
        return
    if start == head:
        segments: list = [(path, start, end)]
    else:  # a key range of a skewed partition: the stream's schema, then only its batches
        segments = [(path, head, head + schema_len), (path, start, end), _EOS]
    reader = pa.ipc.open_stream(io.BufferedReader(_Segments(segments), buffer_size=READ_CHUNK))
    yield from reader


def write_pickle_frames(f, records: Iterable[tuple], frames: list | None = None) -> int:
    """Write sorted records as zstd frames of about FRAME_TARGET bytes; returns bytes written.
    With `frames`, appends (first hash, records, offset) per frame: frames are self-contained,
    so a key range can be read from any frame boundary."""
    compressor = zstandard.ZstdCompressor(level=1)
    length = 0
    frame: list[tuple] = []
    size = 0
    for record in records:
        frame.append(record)
        size += len(record[5]) + len(record[1])
        if size >= FRAME_TARGET:
            if frames is not None:
                frames.append((frame[0][0], len(frame), length))
            length += _write_frame(f, compressor, frame)
            frame, size = [], 0
    if frame:
        if frames is not None:
            frames.append((frame[0][0], len(frame), length))
        length += _write_frame(f, compressor, frame)
    return length


def _write_frame(f, compressor, frame: list[tuple]) -> int:
    data = compressor.compress(pickle.dumps(frame, protocol=5))
    f.write(_LEN.pack(len(data)))
    f.write(data)
    return _LEN.size + len(data)


def read_pickle_range(path: str, offset: int, length: int) -> Iterator[Any]:
    """Records of one partition of a pickle run, a frame at a time."""
    stream = io.BufferedReader(_Segments([(path, offset, offset + length)]), buffer_size=READ_CHUNK)
    decompressor = zstandard.ZstdDecompressor()
    while header := stream.read(_LEN.size):
        if len(header) < _LEN.size:
            raise EOFError(f"{path}: shuffle run ends inside a frame header")
        (size,) = _LEN.unpack(header)
        data = stream.read(size)
        if len(data) < size:
            raise EOFError(f"{path}: shuffle run ends inside a frame")
        yield from pickle.loads(decompressor.decompress(data))
