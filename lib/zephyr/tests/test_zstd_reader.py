"""The strict zstd reader's promises, whatever decodes: memory stays bounded on highly
compressible input, the storage's own errors pass through unrenamed, bytes after the last frame
are corrupt input, a cut frame is truncated input, and every frame is read at any read size."""

import io
import subprocess
import sys
import textwrap

import pytest
import zstandard

from zephyr.io.compression import Codec, CorruptInputError, TruncatedInputError, open_compressed_reader

LINES = b"".join(b'{"i": %d, "text": "%s"}\n' % (i, b"word " * (i % 13)) for i in range(30_000))


def _read_all(blob: bytes, size: int = 1 << 20) -> bytes:
    with open_compressed_reader(io.BytesIO(blob), Codec.ZSTD) as reader:
        return b"".join(iter(lambda: reader.read(size), b""))


@pytest.mark.parametrize("size", [1, 4096, 1 << 20, 1 << 24])
def test_several_frames_read_whole_at_any_read_size(size):
    frames = [zstandard.ZstdCompressor(level=level).compress(LINES[i::3]) for i, level in enumerate((1, 3, 19))]
    blob = b"".join(frames)
    oracle = b"".join(LINES[i::3] for i in range(3))
    assert _read_all(blob, size if size > 1 else 7) == oracle


def test_bytes_after_the_last_frame_are_corrupt_input():
    blob = zstandard.ZstdCompressor().compress(LINES) + b"this is not zstd"
    with pytest.raises(CorruptInputError, match="not a valid zstd stream"):
        _read_all(blob)


def test_a_cut_inside_the_frame_is_truncated_input():
    blob = zstandard.ZstdCompressor().compress(LINES)
    with pytest.raises(TruncatedInputError):
        _read_all(blob[: len(blob) * 2 // 3])


class _FailingStorage(io.RawIOBase):
    """Gives the first `good` bytes of `data`, then fails the way a lost connection does."""

    def __init__(self, data: bytes, good: int):
        self._data, self._good, self._pos = data, good, 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer) -> int:
        if self._pos >= self._good:
            raise OSError("connection reset by the storage")
        n = min(len(buffer), self._good - self._pos)
        buffer[:n] = self._data[self._pos : self._pos + n]
        self._pos += n
        return n


def test_a_storage_error_passes_through_as_raised_not_as_corrupt_input():
    blob = zstandard.ZstdCompressor().compress(LINES)
    with open_compressed_reader(_FailingStorage(blob, len(blob) // 2), Codec.ZSTD) as reader:
        with pytest.raises(OSError, match="connection reset by the storage") as info:
            while reader.read(1 << 16):
                pass
    assert type(info.value) is OSError  # neither TruncatedInputError nor CorruptInputError


def test_memory_stays_bounded_on_highly_compressible_input():
    """256 MiB of zeros (~8 kB compressed) read in 1 MiB reads, in a fresh process so that the
    Arrow pool's high-water mark and tracemalloc's peak are this read's alone (main's reader
    peaks at ~20 MB of Python memory here, Arrow's streaming decompressor at ~3 MB)."""
    code = textwrap.dedent("""
        import io, tracemalloc
        import pyarrow as pa, zstandard
        from zephyr.io.compression import Codec, open_compressed_reader
        cobj = zstandard.ZstdCompressor().compressobj()
        blob = b"".join(cobj.compress(bytes(1 << 24)) for _ in range(16)) + cobj.flush()
        tracemalloc.start()
        total = zeros = 0
        with open_compressed_reader(io.BytesIO(blob), Codec.ZSTD) as reader:
            while piece := reader.read(1 << 20):
                total += len(piece)
                zeros += piece.count(0)
        print(total, zeros, pa.default_memory_pool().max_memory(), tracemalloc.get_traced_memory()[1])
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300, check=True)
    total, zeros, arrow_peak, python_peak = map(int, done.stdout.split())
    assert total == zeros == 256 << 20
    assert arrow_peak < 64 << 20, arrow_peak
    assert python_peak < 64 << 20, python_peak
