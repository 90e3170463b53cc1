"""Compression chosen by file extension, with strict readers.

Writers are deterministic (gzip headers carry no timestamp or name), so the same items give
the same bytes. Readers fail loudly on truncated input: `zstandard`'s stream reader returns a
short read at a cut-off frame without complaint, so zstd is decoded frame by frame here and a
frame that never ends is an error.
"""

from __future__ import annotations

import bz2
import gzip
import io
import lzma
import zlib
from enum import Enum
from typing import BinaryIO

import zstandard

__all__ = [
    "COMPRESSION_SUFFIXES",
    "Codec",
    "CorruptInputError",
    "TruncatedInputError",
    "codec_for",
    "open_compressed_reader",
    "open_compressed_writer",
    "strip_compression_suffix",
]

_CHUNK = 1 << 20
ZSTD_LEVEL = 3


class Codec(Enum):
    NONE = "none"
    GZIP = "gzip"
    ZSTD = "zstd"
    BZIP2 = "bzip2"
    XZ = "xz"


_SUFFIXES = {
    ".gz": Codec.GZIP, ".gzip": Codec.GZIP, ".zst": Codec.ZSTD, ".zstd": Codec.ZSTD, ".bz2": Codec.BZIP2, ".xz": Codec.XZ,
}
COMPRESSION_SUFFIXES = tuple(_SUFFIXES)


def codec_for(path: str) -> Codec:
    """The codec a path's extension asks for (`.gz`, `.zst`/`.zstd`, `.bz2`, `.xz`, otherwise none)."""
    lowered = path.lower()
    for suffix, codec in _SUFFIXES.items():
        if lowered.endswith(suffix):
            return codec
    return Codec.NONE


def strip_compression_suffix(path: str) -> str:
    """`a/b.jsonl.zst` -> `a/b.jsonl`; used to find the format under the compression."""
    lowered = path.lower()
    for suffix in _SUFFIXES:
        if lowered.endswith(suffix):
            return path[: -len(suffix)]
    return path


class TruncatedInputError(EOFError):
    """Compressed input ended in the middle of a frame or member."""


class CorruptInputError(ValueError):
    """Compressed input that is not a valid stream of its codec (bad magic, bad checksum)."""


class _StrictZstdReader(io.RawIOBase):
    """Decodes concatenated zstd frames; raises TruncatedInputError if the last frame is cut.

    `decompressobj` has no output limit, so highly compressible input could inflate one
    input chunk into hundreds of MB. The input is fed in slices sized from the ratio seen so
    far, keeping each call's output near `_TARGET_OUT` bytes.
    """

    _TARGET_OUT = 1 << 21

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._dobj = zstandard.ZstdDecompressor().decompressobj()
        self._in_frame = False
        self._inbuf = b""
        self._inpos = 0
        self._feed = 1 << 8  # tiny first feed: the ratio is unknown until the first output
        self._pending = memoryview(b"")
        self._eof = False
        self._seen_input = False

    def readable(self) -> bool:
        return True

    def _next_piece(self) -> bytes:
        if self._inpos >= len(self._inbuf):
            self._inbuf = self._raw.read(_CHUNK)
            self._inpos = 0
            if not self._inbuf:
                return b""
        piece = self._inbuf[self._inpos : self._inpos + self._feed]
        self._inpos += len(piece)
        return piece

    def _fill(self) -> None:
        while not len(self._pending) and not self._eof:
            piece = self._next_piece()
            if not piece:
                self._eof = True
                if not self._seen_input:
                    raise TruncatedInputError("the file is empty (0 bytes), which is not a valid zstd stream")
                if self._in_frame:
                    raise TruncatedInputError("zstd stream ended in the middle of a frame (truncated file?)")
                return
            self._seen_input = True
            out = []
            while piece:
                try:
                    out.append(self._dobj.decompress(piece))
                except zstandard.ZstdError as e:
                    raise CorruptInputError(f"not a valid zstd stream: {e}") from None
                self._in_frame = True
                if self._dobj.eof:
                    piece = self._dobj.unused_data
                    self._dobj = zstandard.ZstdDecompressor().decompressobj()
                    self._in_frame = False
                else:
                    piece = b""
            produced = sum(len(o) for o in out)
            if produced:
                self._feed = max(1 << 8, min(_CHUNK, self._feed * self._TARGET_OUT // produced))
            self._pending = memoryview(out[0] if len(out) == 1 else b"".join(out))

    def readinto(self, buffer) -> int:
        self._fill()
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


class _StdlibReader(io.RawIOBase):
    """A gzip, bzip2 or xz file of the standard library, whose bare EOFError on truncation and
    codec-specific errors on bad data become TruncatedInputError and CorruptInputError."""

    _OPENERS = {
        Codec.GZIP: (lambda raw: gzip.GzipFile(fileobj=raw, mode="rb"), (gzip.BadGzipFile, zlib.error)),
        Codec.BZIP2: (lambda raw: bz2.BZ2File(raw, mode="rb"), (OSError,)),  # "Invalid data stream"
        Codec.XZ: (lambda raw: lzma.LZMAFile(raw, mode="rb"), (lzma.LZMAError,)),
    }

    def __init__(self, raw: BinaryIO, codec: Codec):
        opener, self._corrupt = self._OPENERS[codec]
        self._name = codec.value
        self._file = opener(raw)
        self._raw = raw
        self._started = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        try:
            n = self._file.readinto(buffer)
            if not self._started:
                self._started = True
                if n == 0 and self._raw.tell() == 0:
                    raise TruncatedInputError(f"the file is empty (0 bytes), which is not a valid {self._name} stream")
            return n
        except EOFError as e:
            if isinstance(e, TruncatedInputError):
                raise
            raise TruncatedInputError(f"{self._name} stream ended early (truncated file?): {e}") from e
        except self._corrupt as e:
            raise CorruptInputError(f"not a valid {self._name} stream: {e}") from None

    def close(self) -> None:
        if not self.closed:
            self._file.close()
            self._raw.close()
        super().close()


def open_compressed_reader(raw: BinaryIO, codec: Codec) -> BinaryIO:
    """A buffered binary reader that decompresses `raw` (and closes it when closed)."""
    if codec is Codec.NONE:
        return raw
    inner = _StrictZstdReader(raw) if codec is Codec.ZSTD else _StdlibReader(raw, codec)
    return io.BufferedReader(inner, buffer_size=_CHUNK)


class _ZstdWriter(io.RawIOBase):
    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self._cobj = zstandard.ZstdCompressor(level=ZSTD_LEVEL).compressobj()

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        self._raw.write(self._cobj.compress(data))  # any bytes-like object: no copy
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._raw.write(self._cobj.flush())
        super().close()


def open_compressed_writer(raw: BinaryIO, codec: Codec) -> BinaryIO:
    """A buffered binary writer compressing into `raw`; closing it finishes the stream, not `raw`."""
    if codec is Codec.NONE:
        return _NonClosing(raw)
    if codec is Codec.GZIP:
        return gzip.GzipFile(fileobj=raw, mode="wb", mtime=0, filename="")
    if codec is Codec.BZIP2:  # bzip2 and xz headers hold no time or name: the same items, the same bytes
        return bz2.BZ2File(raw, mode="wb")
    if codec is Codec.XZ:
        return lzma.LZMAFile(raw, mode="wb")
    return io.BufferedWriter(_ZstdWriter(raw), buffer_size=_CHUNK)


class _NonClosing(io.RawIOBase):
    """Passes writes through; closing it leaves the underlying file open for the committer."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw

    def writable(self) -> bool:
        return True

    def write(self, data) -> int:
        return self._raw.write(data)
