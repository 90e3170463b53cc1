"""The few file operations the executor's and zephyr's leases need, on any fsspec filesystem.

Local disk and object stores (gs://) differ in what is atomic: locally a file appears
complete only through a rename or a hard link; on an object store a single upload appears
atomically and renames are slow copies (the GCS emulator lacks `moveTo` entirely). These
helpers hide that difference so the executor's files mean the same on both.
"""

from __future__ import annotations

import json
import os
import uuid
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem
from zephyr.io.files import atomic_write

__all__ = [
    "filesystem",
    "is_local",
    "read_json",
    "write_json",
    "write_text",
    "create_exclusive",
    "creates_exclusively",
    "list_names",
    "list_ordered",
    "remove",
]


def filesystem(path: str) -> tuple[fsspec.AbstractFileSystem, str]:
    """The filesystem holding `path` and the path as that filesystem spells it."""
    fs, fs_path = fsspec.core.url_to_fs(path)
    return fs, fs_path


def is_local(fs: fsspec.AbstractFileSystem) -> bool:
    return isinstance(fs, LocalFileSystem)


def creates_exclusively(fs: fsspec.AbstractFileSystem) -> bool:
    """Whether `create_exclusive` is trustworthy on `fs`: local disk (hard links) and the
    in-process `memory://` store; not object stores, some of which ignore preconditions."""
    return is_local(fs) or "memory" in fs.protocol


def read_json(path: str) -> Any | None:
    """The JSON object stored at `path`, or None when there is no such file (never cached)."""
    fs, fs_path = filesystem(path)
    try:
        data = fs.cat_file(fs_path)
    except FileNotFoundError:
        return None
    return json.loads(data) if data else None


def write_text(path: str, text: str) -> None:
    """Replace `path` with `text` so that readers see the old or the new content, never half."""
    with atomic_write(path, "wb") as f:
        f.write(text.encode("utf-8"))


def write_json(path: str, obj: Any) -> None:
    """`write_text` of `obj` as indented JSON (non-JSON values are written with `str`)."""
    write_text(path, json.dumps(obj, indent=2, sort_keys=True, default=str) + "\n")


def create_exclusive(path: str, text: str) -> bool:
    """Create `path` holding `text` only if it does not exist; True when this call created it.

    Local disk: a complete temporary file is hard-linked to `path` (link fails if it exists),
    so the file is never seen half-written. Object stores: an upload with the `create`
    precondition (GCS `ifGenerationMatch=0`); stores that ignore preconditions (the GCS
    emulator) may report True to two writers, which is why `lease` uses this on local disk
    only and orders per-contender files on object stores instead.
    """
    fs, fs_path = filesystem(path)
    data = text.encode("utf-8")
    if is_local(fs):
        directory = os.path.dirname(fs_path)
        tmp = os.path.join(directory, f".{os.path.basename(fs_path)}.tmp-{uuid.uuid4().hex}")
        for attempt in range(3):  # a releasing holder may remove the empty folder meanwhile
            os.makedirs(directory, exist_ok=True)
            try:
                with open(tmp, "wb") as f:
                    f.write(data)
                break
            except FileNotFoundError:
                if attempt == 2:
                    raise
        try:
            os.link(tmp, fs_path)
            return True
        except FileExistsError:
            return False
        finally:
            os.unlink(tmp)
    try:
        fs.pipe_file(fs_path, data, mode="create")
        return True
    except FileExistsError:
        return False


def list_names(directory: str) -> list[str]:
    """Base names of the files directly under `directory` ([] when it does not exist)."""
    fs, fs_path = filesystem(directory)
    try:
        entries = fs.ls(fs_path, detail=False, refresh=True) if not is_local(fs) else fs.ls(fs_path, detail=False)
    except FileNotFoundError:
        return []
    return sorted(name.rstrip("/").rsplit("/", 1)[-1] for name in entries)


def _creation_order(entry: dict) -> float:
    """The store's own creation order of an object: GCS generation, else a timestamp."""
    if entry.get("generation") not in (None, ""):
        return float(entry["generation"])
    for key in ("created", "timeCreated", "LastModified", "mtime"):
        value = entry.get(key)
        if value is not None:
            return value.timestamp() if hasattr(value, "timestamp") else float(value)
    return 0.0


def list_ordered(directory: str) -> list[tuple[str, float]]:
    """(base name, creation order) of the files under `directory`, as the store reports them.

    On GCS the order is the object's generation, assigned by the server when the upload
    completes, so an object created after another one was visible has a larger number.
    """
    fs, fs_path = filesystem(directory)
    try:
        entries = fs.ls(fs_path, detail=True, refresh=True) if not is_local(fs) else fs.ls(fs_path, detail=True)
    except FileNotFoundError:
        return []
    return [(entry["name"].rstrip("/").rsplit("/", 1)[-1], _creation_order(entry)) for entry in entries]


def remove(path: str) -> None:
    """Delete the file at `path` if it exists."""
    fs, fs_path = filesystem(path)
    try:
        fs.rm_file(fs_path)
    except FileNotFoundError:
        pass
