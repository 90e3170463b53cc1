"""Helpers job scripts import as `marin.utils`: fsspec paths (local, `gs://`, `memory://`) and TPU hygiene.

Marin's guides write `from marin.utils import fsspec_exists` (sentinel files that make a task
idempotent) and `from marin.utils import remove_tpu_lockfile_on_exit` (TPU tasks on Ray); this
module keeps those imports working. Where the project already has the operation it is re-exported
(`fsspec_exists` is Zephyr's `exists`, `fsspec_glob` is built on Zephyr's glob, the lockfile
decorator is `marin.tpu`'s), so a script and the libraries agree on what a path holds.

Every function takes a path with or without a protocol and returns paths spelled the same way
(`gs://bucket/x` in, `gs://bucket/...` out).
"""

from __future__ import annotations

import datetime as dt
import re

import fsspec
from zephyr.io.files import exists as fsspec_exists
from zephyr.io.files import expand_glob, remove_tree

from marin.tpu.lockfile import remove_tpu_lockfile, remove_tpu_lockfile_on_exit

__all__ = [
    "expand_braces",
    "fsspec_exists",
    "fsspec_get_curr_subdirectories",
    "fsspec_glob",
    "fsspec_isdir",
    "fsspec_mkdirs",
    "fsspec_mtime",
    "fsspec_rm",
    "fsspec_size",
    "rebase_file_path",
    "remove_tpu_lockfile",
    "remove_tpu_lockfile_on_exit",
]


def _fs(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    return fsspec.core.url_to_fs(path)


def _spelled_like(path: str, fs: fsspec.AbstractFileSystem, found: str) -> str:
    """`found` (as `fs` lists it) with the protocol back on when `path` had one."""
    return fs.unstrip_protocol(found) if "://" in path else found


_RANGE = re.compile(r"(-?\d+)\.\.(-?\d+)")


def _brace_options(body: str) -> list[str] | None:
    """The alternatives of one brace group's body (`a,b{c,d}` -> [`a`, `b{c,d}`], `1..3` ->
    [`1`, `2`, `3`]), or None when it is no list (`{shard}`)."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(body):
        depth += {"{": 1, "}": -1}.get(char, 0)
        if char == "," and depth == 0:
            parts.append(body[start:i])
            start = i + 1
    if parts:
        return [*parts, body[start:]]
    if rng := _RANGE.fullmatch(body):
        lo, hi = int(rng.group(1)), int(rng.group(2))
        padded = any(len(b) > 1 and b.lstrip("-").startswith("0") for b in rng.groups())
        width = max(map(len, rng.groups())) if padded else 0
        step = 1 if hi >= lo else -1
        return [str(i).zfill(width) for i in range(lo, hi + step, step)]
    return None


def expand_braces(pattern: str) -> list[str]:
    """Shell-style brace expansion, left to right: `a{1,2}b` -> `a1b`, `a2b`; nested
    `{b,c{1,2}}` -> `b`, `c1`, `c2`; `{0..2}` -> `0`, `1`, `2` (zero-padded when a bound is:
    `{08..10}`). A brace pair that is no list (`{shard}`) is kept as it is."""
    depth, opened = 0, None
    for i, char in enumerate(pattern):
        if char == "{":
            opened = i if depth == 0 else opened
            depth += 1
        elif char == "}" and depth:
            depth -= 1
            if depth == 0:
                options = _brace_options(pattern[opened + 1 : i])
                if options is not None:
                    head, tail = pattern[:opened], pattern[i + 1 :]
                    return [out for option in options for out in expand_braces(head + option + tail)]
    return [pattern]


def fsspec_glob(pattern: str) -> list[str]:
    """Files matching `pattern` (`*`, `**`, `?`, `[..]` and `{a,b}`/`{0..9}` braces), sorted per
    brace alternative, each once. As in a shell, wildcards skip hidden names (`.executor_status`,
    `.zephyr-run.json`); directories are not listed (see `fsspec_get_curr_subdirectories`)."""
    seen: dict[str, None] = {}
    for alternative in expand_braces(pattern):
        seen.update(dict.fromkeys(expand_glob(alternative)))
    return list(seen)


def fsspec_mkdirs(path: str, exist_ok: bool = True) -> None:
    """Create directory `path` and its parents (object stores have no directories: a no-op there)."""
    fs, fs_path = _fs(path)
    fs.makedirs(fs_path, exist_ok=exist_ok)


def fsspec_rm(path: str) -> bool:
    """Remove a file or a whole directory tree; True if something was there. Safe when another
    process removes it at the same time (a retried task racing its earlier attempt)."""
    fs, fs_path = _fs(path)
    if not fs.exists(fs_path):
        return False
    try:
        remove_tree(path)  # the path taken literally: fsspec's rm globs "[" on object stores
    except FileNotFoundError:
        pass  # removed by someone else in between: the outcome is the same
    return True


def fsspec_isdir(path: str) -> bool:
    """Whether `path` is a directory (on an object store: a prefix with objects under it)."""
    fs, fs_path = _fs(path)
    return fs.isdir(fs_path)


def fsspec_get_curr_subdirectories(path: str) -> list[str]:
    """The immediate subdirectories of directory `path`, sorted (not `path` itself, not files).
    `FileNotFoundError` when `path` does not exist."""
    fs, fs_path = _fs(path)
    entries = fs.ls(fs_path, detail=True)
    found = sorted(e["name"].rstrip("/") for e in entries if e["type"] == "directory")
    own = fs_path.rstrip("/")
    return [_spelled_like(path, fs, name) for name in found if name != own]


def fsspec_size(path: str) -> int:
    """The size of file `path` in bytes."""
    fs, fs_path = _fs(path)
    return fs.size(fs_path)


def fsspec_mtime(path: str) -> dt.datetime:
    """When file `path` was last written (`fs.modified`; an aware datetime on object stores)."""
    fs, fs_path = _fs(path)
    return fs.modified(fs_path)


def rebase_file_path(
    base_in_path: str,
    file_path: str,
    base_out_path: str,
    new_extension: str | None = None,
    old_extension: str | None = None,
) -> str:
    """`file_path`'s place under `base_in_path`, moved under `base_out_path`: the output path
    of a task that mirrors its inputs. With `new_extension` (".jsonl.gz"), `old_extension`
    (default: from the last ".") is replaced by it.

        rebase_file_path("gs://b/raw", "gs://b/raw/x/1.json", "gs://b/out", ".jsonl.gz")
        -> "gs://b/out/x/1.jsonl.gz"
    """
    base_in, path = base_in_path.rstrip("/"), file_path
    if not (path == base_in or path.startswith(base_in + "/")):
        raise ValueError(f"{file_path!r} is not under {base_in_path!r}")
    relative = path[len(base_in) :].lstrip("/")
    if new_extension is not None:
        if old_extension is not None:
            if not relative.endswith(old_extension):
                raise ValueError(f"{file_path!r} does not end with {old_extension!r}")
            relative = relative[: len(relative) - len(old_extension)]
        else:
            stem, dot, _ = relative.rpartition(".")
            relative = stem if dot and "/" not in relative[len(stem) :] else relative
        relative += new_extension
    return f"{base_out_path.rstrip('/')}/{relative}" if relative else base_out_path

