"""fsspec file access: one code path for local disk, `gs://` and `memory://`.

`atomic_write` is the invariant "an output path holds a complete file or nothing":
- local disk: write `.NAME.zephyr-tmp-<pid>@<host>-<id>` beside the target, then `os.replace`
  (atomic on POSIX); after a success, temporaries of the same target whose writer process is
  dead (same host) or that are over a day old are removed, while those of live concurrent
  writers (a retried task racing a zombie attempt) are left alone;
- object stores: write a local temporary file (`zephyr-upload-<pid>@<host>-<id>` in the temp
  dir, swept by a later run if its writer was killed: `zephyr.io.temporaries`), then upload it
  with one `put_file`; an object appears only when its upload completes, so no partial object
  is ever visible and nothing is left behind remotely (no rename needed, which the GCS
  emulator lacks anyway).
"""

from __future__ import annotations

import contextlib
import glob
import io
import os
import re
import uuid
from collections.abc import Callable, Iterator
from typing import BinaryIO

import fsspec
from fsspec.implementations.local import LocalFileSystem
from fsspec.implementations.memory import MemoryFileSystem
from fsspec.utils import glob_translate

from zephyr.errors import InputNotFoundError
from zephyr.counters import increment
from zephyr.io.compression import Codec, codec_for, open_compressed_reader, open_compressed_writer
from zephyr.io.temporaries import is_stale, make_temp_file, owner_tag
from concurrent.futures import ThreadPoolExecutor

__all__ = [
    "CountingReader",
    "atomic_write",
    "counted_input",
    "exists",
    "expand_glob",
    "expand_glob_versions",
    "file_location",
    "file_size",
    "file_version",
    "file_versions",
    "version_size",
    "glob_matcher",
    "glob_matches",
    "open_counted_input",
    "open_raw_input",
    "open_input",
    "open_output",
    "remove_empty_dir",
    "remove_temporaries_for",
    "remove_tree",
    "url_to_fs",
]

_TMP_MARKER = ".zephyr-tmp-"


def url_to_fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(path)


def _is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def exists(path: str) -> bool:
    fs, fs_path = url_to_fs(path)
    return fs.exists(fs_path)


def file_size(path: str) -> int:
    """The size in bytes of the file at `path` (any fsspec URL)."""
    fs, fs_path = url_to_fs(path)
    return int(fs.size(fs_path))


def expand_glob(pattern: str) -> list[str]:
    """Sorted files matching an fsspec glob, with the protocol kept (`gs://b/x`, not `b/x`).

    A pattern without wildcards matches itself if it is a file, and so does one whose wildcards
    match nothing, as in a shell (`data[1].jsonl` names that file unless `data1.jsonl`
    exists; `data[[]1].jsonl` names it always). As in a shell (and Hadoop),
    wildcards do not match hidden names (a leading "."): run records, executor status files
    and in-progress temporaries beside outputs are never taken for inputs; name them
    explicitly (`out/.*`) to match them.
    """
    return [path for path, _ in expand_glob_versions(pattern)]


def expand_glob_versions(pattern: str) -> list[tuple[str, str]]:
    """`expand_glob`, each path paired with its `file_version` (from the same listing)."""
    fs, fs_path = url_to_fs(pattern)
    if not fsspec.core.has_magic(fs_path):
        return _literal_file(fs, fs_path, pattern)
    found = fs.glob(fs_path, detail=True)
    files = sorted(p for p, info in found.items() if info.get("type") == "file" and not _hidden_match(fs_path, p))
    if not files:
        return _literal_file(fs, fs_path, pattern)
    named = [fs.unstrip_protocol(p) for p in files] if "://" in pattern else files
    return [(name, file_version(found[p])) for name, p in zip(named, files)]


def _literal_file(fs: fsspec.AbstractFileSystem, fs_path: str, pattern: str) -> list[tuple[str, str]]:
    """[(pattern, version)] when `fs_path` names a file as written, else []. Only absence counts
    as absent: a store that fails to answer (a 503 past gcsfs's retries) raises its own error,
    which the runner can tell from a missing input (`zephyr.errors.is_transient_storage_error`)."""
    try:
        info = fs.info(fs_path)
    except (FileNotFoundError, NotADirectoryError):
        return []
    return [(pattern, file_version(info))] if info.get("type") == "file" else []


# What tells one content of a path from another, by filesystem: an object store's generation
# or etag changes on every write; a local file's mtime (ns) and inode change on every write or
# rename over it; memory:// files have only their creation time. The size counts everywhere.
_VERSION_KEYS = ("generation", "ETag", "etag", "md5Hash", "mtime", "LastModified", "updated", "created", "ino")


def file_version(info: dict) -> str:
    """A short text that changes whenever the file described by `info` (an fsspec `info()`
    or `glob(detail=True)` entry) is rewritten: its size and its store's version fields."""
    parts = [f"size={info.get('size')}"]
    for key in _VERSION_KEYS:
        value = info.get(key)
        if value is None:
            continue
        if hasattr(value, "timestamp"):  # datetimes (memory://, some object stores)
            value = value.timestamp()
        parts.append(f"{key}={value}")
    return ";".join(parts)


def version_size(version: str) -> int | None:
    """The size in bytes a `file_version` text records; None for a file that was missing or
    unreadable, or whose store gave no size."""
    head = version.split(";", 1)[0]
    if not head.startswith("size="):
        return None
    try:
        return int(head[len("size="):])
    except ValueError:
        return None


def file_versions(paths: list[str]) -> dict[str, str]:
    """`file_version` of each path (one `info` request each, 16 at a time); a path that is
    not there maps to "missing", one that cannot be looked at to "unreadable:<error type>"."""
    def version(path: str) -> str:
        try:
            fs, fs_path = url_to_fs(path)
            return file_version(fs.info(fs_path))
        except FileNotFoundError:
            return "missing"
        except Exception as e:  # noqa: BLE001 - the task that reads it reports the real error
            return f"unreadable:{type(e).__name__}"

    unique = list(dict.fromkeys(paths))
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(unique)))) as pool:
        return dict(zip(unique, pool.map(version, unique)))


def glob_matches(pattern: str, path: str) -> bool:
    """Whether the file `path` is, or would be once written, one that `expand_glob(pattern)` takes."""
    return glob_matcher(pattern)(path)


def glob_matcher(pattern: str) -> Callable[[str], bool]:
    """A test of whether a file path is, or would be once written, one that `expand_glob(pattern)`
    takes: the same filesystem (`gs://` and `gcs://` are one; a relative local path is taken from
    the working directory), and fsspec's glob semantics (`**` spans folders, wildcards skip
    hidden names), or the very path a pattern without a match names literally."""
    pattern_fs, pattern_path = file_location(pattern)
    if pattern_fs is None:  # not a path of a filesystem fsspec knows: never read as one
        return lambda path: False
    matcher = re.compile(glob_translate(pattern_path)) if fsspec.core.has_magic(pattern_path) else None

    def matches(path: str) -> bool:
        path_fs, target = file_location(path)
        if path_fs is not pattern_fs:
            return False
        if target == pattern_path:
            return True
        return matcher is not None and matcher.match(target) is not None and not _hidden_match(pattern_path, target)

    return matches


def file_location(url: str) -> tuple[type | None, str]:
    """Where `url` is: its filesystem's class and its path there (two URLs of one file give one
    location: `gs://` and `gcs://`, a relative and an absolute local path). Creates no filesystem
    (so needs no credentials); a chained URL (`simplecache::gs://b/x`) is its last target; the
    class is None for a protocol fsspec does not know."""
    url = url.rsplit("::", 1)[-1]
    protocol, _ = fsspec.core.split_protocol(url)
    try:
        cls = fsspec.get_filesystem_class(protocol or "file")
    except (ValueError, ImportError):
        return None, url
    return cls, cls._strip_protocol(url).rstrip("/")


def _hidden_match(pattern: str, path: str) -> bool:
    """True when a wildcard matched a hidden name: a component below the pattern's literal
    prefix starts with "." while no component of the pattern there does."""
    parts = pattern.split("/")
    literal = next(i for i, part in enumerate(parts) if fsspec.core.has_magic(part))
    if any(part.startswith(".") for part in parts[literal:]):
        return False
    return any(part.startswith(".") for part in path.split("/")[literal:])


# How object stores are read, by access pattern. Front to back ("sequential": JSON Lines, WARC,
# decompression): a read-ahead cache fetching whole blocks (gcsfs's 5 MiB), one request each;
# gcsfs's default ("adaptive") cache sends requests of about what each read call asks, so a
# reader reading 8 KiB at a time made 1,284 requests for a 13 MB file, 6 with read-ahead
# (measured against the GCS emulator). Parts of a file ("ranges": Parquet's column chunks, a
# file's head): no cache, so a read is one request of just the bytes asked.
# Local disk and `memory://` have no such caches. `access` is one of these keys, or None.
_ACCESS = {"sequential": {"cache_type": "readahead"}, "ranges": {"cache_type": "none"}}


def open_input(path: str) -> BinaryIO:
    """A binary reader over `path` (read front to back), decompressed according to its extension.

    Raises FileNotFoundError naming the path when it does not exist.
    """
    return open_compressed_reader(_open_stored(path, "sequential"), codec_for(path))


def _open_stored(path: str, access: str | None = None, **options) -> BinaryIO:
    """The file at `path` as stored (compressed or not), opened for `access` (see `_ACCESS`);
    InputNotFoundError when it is not there."""
    fs, fs_path = url_to_fs(path)
    if access is not None and not isinstance(fs, (LocalFileSystem, MemoryFileSystem)):
        options = {**_ACCESS[access], **options}
    try:
        return fs.open(fs_path, "rb", **options)
    except FileNotFoundError as e:
        raise InputNotFoundError(f"Input file not found: {path}") from e


class CountingReader(io.RawIOBase):
    """A seekable file wrapper that counts the bytes read through it (`bytes_read`): what a
    reader fetched from storage, as stored (compressed bytes for a compressed file)."""

    def __init__(self, raw: BinaryIO):
        self._raw = raw
        self.bytes_read = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        return self._raw.seek(offset, whence)

    def tell(self) -> int:
        return self._raw.tell()

    def read(self, size: int = -1) -> bytes:
        data = self._raw.read(size)
        self.bytes_read += len(data)
        return data

    def readinto(self, buffer) -> int:
        data = self.read(len(buffer))
        buffer[: len(data)] = data
        return len(data)

    def close(self) -> None:
        if not self.closed:
            self._raw.close()
        super().close()


@contextlib.contextmanager
def counted_input(path: str, access: str | None = None, **options) -> Iterator[CountingReader]:
    """The file at `path` as stored, its bytes read added to the `zephyr/bytes_read` counter
    when it closes (however the reading ends). `access` is how it will be read ("sequential"
    or "ranges": the object store cache that suits it); `options` go to the filesystem's `open`."""
    reader = CountingReader(_open_stored(path, access, **options))
    try:
        yield reader
    finally:
        reader.close()
        increment("zephyr/bytes_read", reader.bytes_read)


@contextlib.contextmanager
def open_counted_input(path: str) -> Iterator[BinaryIO]:
    """`open_input(path)`, counting under `zephyr/bytes_read` the bytes fetched from storage
    (compressed, as stored), not the decompressed bytes the caller reads."""
    with counted_input(path, "sequential") as stored:
        codec = codec_for(path)
        buffered = io.BufferedReader(stored) if codec is Codec.NONE else stored  # the codecs buffer their own
        with open_compressed_reader(buffered, codec) as reader:
            yield reader


def open_raw_input(path: str) -> BinaryIO:
    """A seekable binary reader over the bytes of `path` as stored (no decompression).

    Raises InputNotFoundError (a FileNotFoundError) naming the path when it does not exist.
    """
    return _open_stored(path)


@contextlib.contextmanager
def atomic_write(path: str, mode: str = "wb", *, remove_stale: bool = True) -> Iterator[BinaryIO]:
    """Open `path` for writing so that it appears complete on clean exit and not at all otherwise.

    `mode` is "wb" (binary) or "w" (UTF-8 text). No compression is applied here; see `open_output`.
    `remove_stale=False` skips the scan for dead writers' temporaries after the write (one
    directory listing per write): Zephyr's writers clean up once per stage instead.
    """
    if mode not in ("wb", "w"):
        raise ValueError(f"atomic_write mode must be 'wb' or 'w', got {mode!r}")
    fs, fs_path = url_to_fs(path)
    tmp = None
    try:  # from the temporary's creation on: an interrupt landing anywhere still removes it
        if _is_local(fs):
            directory, name = os.path.split(os.path.abspath(fs_path))
            _makedirs(directory)
            tmp = os.path.join(directory, f".{name}{_TMP_MARKER}{owner_tag()}-{uuid.uuid4().hex[:12]}")
        else:
            tmp = make_temp_file("upload")
        with open(tmp, "wb") as raw:
            if mode == "w":
                text = io.TextIOWrapper(raw, encoding="utf-8", newline="")
                yield text
                text.flush()
                text.detach()
            else:
                yield raw
        _count_written(os.path.getsize(tmp))
        if _is_local(fs):
            os.replace(tmp, os.path.join(directory, name))
            if remove_stale:
                _remove_stale_temporaries(directory, name)
        else:
            try:
                _upload(fs, tmp, fs_path)
            except Exception as e:  # the storage client's message may not name the object
                e.add_note(f"while uploading {path}")
                raise
            fs.invalidate_cache(fs._parent(fs_path))
    finally:
        if tmp is not None:
            with contextlib.suppress(FileNotFoundError):
                os.remove(tmp)


def _upload(fs, local: str, fs_path: str) -> None:
    """Publish the file `local` at `fs_path` in one step. Object stores' uploads are atomic
    (gcsfs, s3fs, adlfs); fsspec's default `put_file`, which `memory://` uses, opens the target
    and copies blocks into it, so an interrupt mid-copy left a partial object at the final path
    (which a `skip_existing` rerun then kept): `memory://` gets the whole bytes at once."""
    if isinstance(fs, MemoryFileSystem):
        with open(local, "rb") as f:
            fs.pipe_file(fs_path, f.read())
    else:
        fs.put_file(local, fs_path)


def _makedirs(directory: str) -> None:
    """`os.makedirs`, tolerating a concurrent run removing an empty parent meanwhile (a
    finished run removes its empty `.zephyr-scratch`, which another run may be entering)."""
    for _ in range(3):
        try:
            os.makedirs(directory, exist_ok=True)
            return
        except FileNotFoundError:
            continue
    os.makedirs(directory, exist_ok=True)


def remove_empty_dir(path: str) -> bool:
    """Remove the folder `path` if it is empty: local disk and `memory://` (object stores have
    no folders to remove)."""
    fs, fs_path = url_to_fs(path)
    if isinstance(fs, MemoryFileSystem):
        try:
            if fs.isdir(fs_path) and not fs.ls(fs_path, detail=False):
                fs.rmdir(fs_path)
                return True
        except (OSError, FileNotFoundError):
            pass
        return False
    if not _is_local(fs):
        return False
    try:
        os.rmdir(fs_path)
    except OSError:  # missing, not empty, or busy: leave it
        return False
    return True


def remove_tree(path: str) -> None:
    """Remove the file or folder `path` and everything under it, taking `path` literally:
    fsspec's `rm` globs a path holding "[", "*" or "?" on object stores and `memory://`
    (so `out[1]/...` was not found, or another path matched), though not on local disk."""
    fs, fs_path = url_to_fs(path)
    fs.rm(fs_path if _is_local(fs) else glob.escape(fs_path), recursive=True)


def _count_written(size: int) -> None:
    """Bytes a shard task wrote (its outputs, shuffle runs, manifests): the `zephyr/bytes_written` counter."""
    increment("zephyr/bytes_written", size)


@contextlib.contextmanager
def open_output(path: str, *, remove_stale: bool = True) -> Iterator[BinaryIO]:
    """`atomic_write` plus compression chosen by the extension of `path`."""
    with atomic_write(path, remove_stale=remove_stale) as raw:
        writer = open_compressed_writer(raw, codec_for(path))
        yield writer
        writer.close()


def remove_temporaries_for(paths: list[str]) -> int:
    """Remove every leftover temporary of these (finished) local outputs: one listing per
    directory. Object stores have none. Returns how many were removed."""
    by_dir: dict[str, set[str]] = {}
    for path in paths:
        fs, fs_path = url_to_fs(path)
        if _is_local(fs):
            directory, name = os.path.split(os.path.abspath(fs_path))
            by_dir.setdefault(directory, set()).add(name)
    removed = 0
    for directory, names in by_dir.items():
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(directory):
                if entry.name.startswith(".") and _TMP_MARKER in entry.name:
                    if entry.name[1 : entry.name.index(_TMP_MARKER)] in names:
                        with contextlib.suppress(FileNotFoundError):
                            os.remove(entry.path)
                            removed += 1
    return removed


def _remove_stale_temporaries(directory: str, name: str) -> None:
    prefix = f".{name}{_TMP_MARKER}"
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            if entry.name.startswith(prefix) and is_stale(entry, entry.name[len(prefix) :]):
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry.path)
