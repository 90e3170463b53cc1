"""Shards sized by bytes: `approx_shard_bytes=N` on the loader right after the source.

The planner turns the source's files into shards of about N bytes as stored (a compressed
file counts its compressed bytes), so the number of tasks follows the data, not the count of
files:

- files of at most N bytes are packed into shards of up to N bytes, consecutive files in
  their sorted order (so records come out in the order one shard per file gives them),
  each file counting its bytes plus what opening it costs (`FILE_COST`): a shard of many tiny
  files takes about as long as one of a few large files, not hundreds of times longer;
- a larger file is cut into pieces, each a shard of its own:
  - uncompressed JSON Lines into ceil(size / N) equal spans of bytes (`ByteRange`: a span owns
    the lines that start in it, so no file is read when planning);
  - WARC and WET files, plain or gzipped record by record, the same way (a span owns the
    records that start in it; the planner reads the first MiB of a `.gz` one to tell that
    it is gzipped per record and not whole);
  - Parquet into runs of whole row groups of up to N bytes (`ParquetSlice`; reads the footer);
  - anything else is not cut and stays a shard of its own, which the plan says: compressed
    JSON Lines (a decompressor cannot start mid-stream), a WARC file gzipped whole, Vortex, a
    Parquet file of one row group.

Sizes come from the listing that resolved the source (no request per file); only the files
being cut are opened when planning, 16 at a time.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem

from zephyr.errors import InputNotFoundError
from zephyr.io.compression import Codec, codec_for
from zephyr.io.files import file_versions, url_to_fs, version_size
from zephyr.io.formats import FileFormat, format_for
from zephyr.plan import ops as op
from zephyr.plan.sources import ByteRange, ParquetSlice, SourceShard

__all__ = ["FILE_COST", "Sizing", "file_cost", "size_shards"]

# What opening and reading one more file costs a task, in bytes of reading a file it has open:
# on local disk (and memory://) a 1.5 KB JSON Lines file took what ~45 KB of a span took; on
# the GCS emulator ~800 KB (gcsfs asks for the object's metadata three times, then its bytes).
# Real object stores answer each request more slowly still: their figure is a floor.
FILE_COST = {"local": 64 << 10, "object store": 1 << 20}

@dataclass(frozen=True)
class _File:
    path: str
    version: str
    size: int | None  # None: missing or unreadable when listed (its task reports why)
    listed: bool  # from `from_files` (the shard's `path`, for `{basename}` and provenance)


@dataclass
class Sizing:
    """What sizing made of the source's files, for the plan's description."""

    approx_bytes: int
    file_cost: int = 0  # what packing counts a file as beyond its bytes (`FILE_COST`)
    files: int = 0
    bytes: int = 0
    packed_files: int = 0  # files that share a shard with others
    packed_shards: int = 0
    cut_files: int = 0
    pieces: int = 0
    kept_whole: Counter = field(default_factory=Counter)  # why a file larger than the target was not cut -> files

    def describe(self) -> str:
        parts = [f"{_count(self.files, 'file')} ({_size_text(self.bytes)})"]
        if self.packed_files:
            parts.append(f"{self.packed_files:,} packed into {_count(self.packed_shards, 'shard')}")
        if self.cut_files:
            parts.append(f"{self.cut_files:,} cut into {_count(self.pieces, 'piece')}")
        for why, count in sorted(self.kept_whole.items()):
            parts.append(f"{count:,} larger kept whole ({why})")
        return f"[~{_size_text(self.approx_bytes)} a shard, a file counting {_size_text(self.file_cost)} more: {'; '.join(parts)}]"


def size_shards(shards: Sequence[SourceShard], approx_bytes: int, load: Any) -> tuple[list[SourceShard], Sizing]:
    """The source's shards repacked toward `approx_bytes` a shard (see the module docstring).

    `load` is the loader that reads them (its type tells the format, or `load_file` asks the
    extension). Raises TypeError for items that are not paths."""
    files = _files_of(shards)
    sizing = Sizing(approx_bytes, file_cost(files[0].path) if files else 0, len(files), sum(f.size or 0 for f in files))
    large = [f for f in files if f.size is not None and f.size > approx_bytes]
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(large)))) as pool:
        cuts = dict(zip((f.path for f in large), pool.map(lambda f: _cut(f, approx_bytes, _format(load, f.path)), large)))
    out: list[SourceShard] = []
    run: list[_File] = []  # consecutive small files not yet in a shard
    total = 0  # their cost: bytes, and FILE_COST each
    for file in files:
        if file.size is not None and file.size <= approx_bytes:
            cost = file.size + file_cost(file.path)
            if run and total + cost > approx_bytes:
                out.append(_packed(run, sizing))
                run, total = [], 0
            run.append(file)
            total += cost
            continue
        if run:
            out.append(_packed(run, sizing))
            run, total = [], 0
        out.extend(_pieces(file, cuts.get(file.path), sizing))
    if run:
        out.append(_packed(run, sizing))
    return out, sizing


def file_cost(path: str) -> int:
    """`FILE_COST` of the store `path` is on (a local or memory:// path, or an object store)."""
    protocol, _ = fsspec.core.split_protocol(path.rsplit("::", 1)[-1])
    return _protocol_cost(protocol or "file")


@lru_cache(maxsize=None)
def _protocol_cost(protocol: str) -> int:
    try:
        local = issubclass(fsspec.get_filesystem_class(protocol), (LocalFileSystem, MemoryFileSystem))
    except (ValueError, ImportError):  # a protocol fsspec does not know: its task says so
        local = False
    return FILE_COST["local" if local else "object store"]


def _pieces(file: _File, cut: list | str | None, sizing: Sizing) -> list[SourceShard]:
    """The shards of a file larger than the target: its pieces, or itself whole (`cut` says why)."""
    if not isinstance(cut, list):
        if cut is not None:
            sizing.kept_whole[cut] += 1
        return [_whole(file)]
    sizing.cut_files += 1
    sizing.pieces += len(cut)
    return [SourceShard((piece,), str(piece), file.path if file.listed else None, file.version) for piece in cut]


def _files_of(shards: Sequence[SourceShard]) -> list[_File]:
    """Every path item of the shards with its version and size, in order."""
    for shard in shards:
        for item in shard.items:
            if not isinstance(item, str):
                raise TypeError(f"approx_shard_bytes packs and cuts input files, so the items must be paths; got "
                                f"{type(item).__name__}: {item!r:.100}")
    shared = [s for s in shards if len(s.items) > 1]  # from_iterable(paths): one version text for all its items
    versions = file_versions([p for s in shared for p in s.items]) if shared else {}
    files = []
    for shard in shards:
        for item in shard.items:
            version = versions[item] if len(shard.items) > 1 else shard.version
            files.append(_File(item, version, version_size(version), shard.path is not None))
    return files


def _whole(file: _File) -> SourceShard:
    return SourceShard((file.path,), file.path, file.path if file.listed else None, file.version)


def _packed(run: list[_File], sizing: Sizing) -> SourceShard:
    if len(run) == 1:
        return _whole(run[0])
    sizing.packed_files += len(run)
    sizing.packed_shards += 1
    label = f"{len(run)} files ({_size_text(sum(f.size for f in run))}): {run[0].path} .. {run[-1].path}"
    return SourceShard(tuple(f.path for f in run), label, None, ";".join(f.version for f in run))


def _format(load: Any, path: str) -> FileFormat | None:
    fixed = op.fixed_format(load)
    if fixed is not None:
        return fixed
    try:
        return format_for(path)
    except ValueError:  # the planner's extension check names it
        return None


def _cut(file: _File, approx_bytes: int, fmt: FileFormat | None) -> list | str:
    """The pieces a file larger than `approx_bytes` is cut into, or why it is not cut."""
    codec = codec_for(file.path)
    if fmt is FileFormat.PARQUET:
        sizes = _row_group_sizes(file.path)
        runs = _pack(sizes, approx_bytes)
        if len(runs) > 1:
            return [ParquetSlice(file.path, groups) for groups in runs]
        return "Parquet of one row group" if len(sizes) == 1 else "Parquet whose row groups fit one shard"
    if fmt is FileFormat.JSONL:
        return _spans(file, approx_bytes) if codec is Codec.NONE else "compressed JSON Lines"
    if fmt is FileFormat.WARC:
        if codec is Codec.NONE or (codec is Codec.GZIP and _gzipped_per_record(file.path)):
            return _spans(file, approx_bytes)
        return "WARC compressed whole"
    return "Vortex" if fmt is FileFormat.VORTEX else "format unknown"


def _spans(file: _File, approx_bytes: int) -> list[ByteRange]:
    """ceil(size / approx_bytes) spans of equal size (within a byte) tiling the file."""
    count = -(-file.size // approx_bytes)
    bounds = [file.size * i // count for i in range(count + 1)]
    return [ByteRange(file.path, bounds[i], bounds[i + 1]) for i in range(count)]


def _gzipped_per_record(path: str) -> bool:
    from zephyr.io.warc import gzipped_per_record  # fastwarc: imported only where WARC files are cut

    try:
        return gzipped_per_record(path)
    except FileNotFoundError:
        return False  # gone since listed: its task says so


def _row_group_sizes(path: str) -> list[int]:
    """Each row group's bytes as stored (compressed), from the file's footer."""
    import pyarrow.parquet as pq

    fs, fs_path = url_to_fs(path)
    try:
        with fs.open(fs_path, "rb") as f:
            meta = pq.ParquetFile(f).metadata
    except FileNotFoundError as e:
        raise InputNotFoundError(f"Input file not found: {path}") from e
    except Exception as e:
        raise ValueError(f"{path}: not a readable Parquet file, so it cannot be split by approx_shard_bytes: {e}") from e
    return [sum(rg.column(c).total_compressed_size for c in range(rg.num_columns)) for rg in map(meta.row_group, range(meta.num_row_groups))]


def _pack(sizes: list[int], approx_bytes: int) -> list[tuple[int, ...]]:
    """Consecutive row groups in runs of up to `approx_bytes` (a larger group is a run of its own)."""
    runs: list[tuple[int, ...]] = []
    current: list[int] = []
    total = 0
    for index, size in enumerate(sizes):
        if current and total + size > approx_bytes:
            runs.append(tuple(current))
            current, total = [], 0
        current.append(index)
        total += size
    if current:
        runs.append(tuple(current))
    return runs


def _count(n: int, noun: str) -> str:
    return f"{n:,} {noun}{'' if n == 1 else 's'}"


def _size_text(n: int) -> str:
    for unit, scale in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"
