"""Scratch roots: who made them, and removing the ones no rerun can use.

A scatter stage writes under `<scratch_dir>/<stage fingerprint>/`; a rerun of the same work
resumes from there. Each root gets an `owner.json` marker when its stage starts: the
pipeline's final output (directory and writer pattern) and the fingerprint. With it, a run
that succeeds removes the roots earlier runs of the same pipeline left under the same
scratch dir (made by older code or inputs, they can never be resumed: at most one run writes
an output at a time). A pipeline without an output (results go to the driver) cannot tell
its older scratch from another pipeline's, so it leaves other roots alone. A root whose
scratch lease a live run holds (another pipeline sharing an explicit scratch_dir) stays too;
a dead holder's lease files go with the root.
"""

from __future__ import annotations

import logging

import orjson

from zephyr.io.files import url_to_fs
from zephyr.ops import WRITE_OPS, callable_name
from zephyr.run_lock import release_dead_scratch_lease
from zephyr.status.record import final_output_dir

__all__ = ["OWNER_NAME", "mark_root", "owner_of", "remove_older_roots", "remove_roots"]

OWNER_NAME = "owner.json"
logger = logging.getLogger("zephyr")


def owner_of(plan) -> dict | None:
    """What identifies the pipeline across code changes: its final output directory and the
    final writer's pattern; None when it writes no output."""
    directory = final_output_dir(plan)
    if directory is None:
        return None
    writer = next(r for r in reversed(plan.stages[-1].ops) if isinstance(r, WRITE_OPS))
    pattern = writer.pattern if isinstance(writer.pattern, str) else callable_name(writer.pattern)
    return {"output": directory, "pattern": pattern}


def mark_root(root: str, owner: dict | None, fingerprint: str) -> None:
    """Record who made `root` (written once; a resumed run finds it there)."""
    fs, path = url_to_fs(f"{root}/{OWNER_NAME}")
    try:
        if not fs.exists(path):
            fs.makedirs(path.rsplit("/", 1)[0], exist_ok=True)
            fs.pipe_file(path, orjson.dumps({"owner": owner, "fingerprint": fingerprint}))
    except OSError as e:  # the marker only helps cleanup: say so and go on
        logger.warning("zephyr: could not mark scratch %s: %s", root, e)


def remove_roots(roots: list[str]) -> None:
    """Remove scratch roots; a failure is logged (leftover scratch is harmless)."""
    for root in roots:
        fs, path = url_to_fs(root)
        try:
            if fs.exists(path):
                fs.rm(path, recursive=True)
        except OSError as e:
            logger.warning("zephyr: could not remove scratch %s: %s", root, e)


def remove_older_roots(scratch_dir: str, owner: dict | None, keep: set[str]) -> list[str]:
    """Remove the roots under `scratch_dir` whose marker names `owner` (none when `owner` is
    None), except `keep`; returns the roots removed."""
    if owner is None:
        return []
    fs, base = url_to_fs(scratch_dir)
    kept = {url_to_fs(root)[1].rstrip("/") for root in keep}
    try:
        fs.invalidate_cache(base)  # roots another process made since this one last listed
        children = fs.ls(base, detail=False)
    except (FileNotFoundError, NotADirectoryError):
        return []
    older = []
    for child in children:
        child = child.rstrip("/")
        if child in kept:
            continue
        try:
            marker = orjson.loads(fs.cat_file(f"{child}/{OWNER_NAME}"))
        except (OSError, orjson.JSONDecodeError):  # not a root, or not one we marked
            continue
        if isinstance(marker, dict) and marker.get("owner") == owner:
            older.append(child)
    removed = []
    for child in older:
        root = fs.unstrip_protocol(child) if "://" in scratch_dir else child
        try:
            # a root shared with another pipeline's live run (an explicit scratch_dir) stays
            if not release_dead_scratch_lease(root):
                continue
            fs.rm(child, recursive=True)
            removed.append(child)
        except OSError as e:
            logger.warning("zephyr: could not remove older scratch %s: %s", child, e)
    return removed
