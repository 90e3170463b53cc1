"""Scratch: where a run's shuffles spill, what a rerun resumes from it, who made it, when it goes.

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

import glob
import logging
import os
import tempfile
from dataclasses import replace

import orjson

from zephyr.io.files import expand_glob, remove_empty_dir, remove_tree, url_to_fs
from zephyr.naming import callable_name
from zephyr.plan.ops import WRITE_OPS
from zephyr.execution.run_lock import release_dead_scratch_lease
from zephyr.shuffle.scatter import ScatterSink
from zephyr.status.record import final_output_dir
from zephyr.tasks import ShardResult

__all__ = ["OWNER_NAME", "ScratchSpace", "mark_root", "owner_of", "remove_older_roots", "remove_roots", "scratch_dir_for"]

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
                remove_tree(root)
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
            remove_tree(root)
            removed.append(child)
        except OSError as e:
            logger.warning("zephyr: could not remove older scratch %s: %s", child, e)
    return removed


class ScratchSpace:
    """One run's scratch: the directory its scatter stages write under (one root per stage,
    named by the stage's fingerprint, so a rerun of the same work finds it), the map shards an
    earlier run finished there, and what is removed when the run ends."""

    def __init__(self, backend, plan):
        self.dir = scratch_dir_for(backend, plan)
        # the default folder beside the output is ours to remove once empty
        self.is_default = not getattr(backend, "scratch_dir", None) and not os.environ.get("ZEPHYR_SCRATCH_DIR")
        self.owner = owner_of(plan)  # marks this pipeline's roots

    def bind(self, plan):
        """`plan` with each scatter stage's sink writing under its root in this scratch dir."""
        return replace(plan, stages=tuple(self.bind_stage(s) for s in plan.stages))

    def bind_stage(self, stage):
        """`stage` with its sink, if it scatters, writing under its root in this scratch dir."""
        if not isinstance(stage.sink, ScatterSink):
            return stage
        return replace(stage, sink=replace(stage.sink, root=f"{self.dir}/{stage.fingerprint}"))

    def mark(self, stage) -> None:
        if isinstance(stage.sink, ScatterSink):
            mark_root(stage.sink.root, self.owner, stage.fingerprint)

    def left_by_earlier_run(self, plan) -> bool:
        """An unfinished earlier run left scratch: its outputs may be incomplete (a stage whose
        partitions were split writes more shards than the plan says), so resume it instead."""
        for root in _roots(plan):
            fs, path = url_to_fs(root)
            if fs.exists(path):
                return True
        return False

    def completed_maps(self, stage) -> dict[int, ShardResult]:
        """Map shards of a scatter stage whose manifest exists: finished by an earlier run."""
        if not isinstance(stage.sink, ScatterSink):
            return {}
        done = {}
        for path in expand_glob(f"{glob.escape(stage.sink.root)}/map-*.json"):
            fs, fs_path = url_to_fs(path)
            summary = orjson.loads(fs.cat_file(fs_path))
            shard = summary["map_shard"]
            done[shard] = ShardResult(shard=shard, items=None, counters=summary.get("counters", {}), summary=summary)
        return done

    def remove(self, plan) -> None:
        """This run's scratch, and what earlier runs of the same pipeline left."""
        roots = _roots(plan)
        remove_roots(roots)
        remove_older_roots(self.dir, self.owner, set(roots))
        if self.is_default:
            remove_empty_dir(self.dir)

    def remove_unresumable(self, plan) -> None:
        """A failed or stopped run keeps its scratch for a rerun, except where none can use it."""
        remove_roots([s.sink.root for s in plan.stages if isinstance(s.sink, ScatterSink) and s.not_resumable])


def scratch_dir_for(backend, plan) -> str:
    """Where scatter runs go: the backend's `scratch_dir`, else $ZEPHYR_SCRATCH_DIR, else a
    `.zephyr-scratch` folder beside the pipeline's final output, else the local temp dir.

    On a multi-node cluster it must be storage every worker sees (e.g. a `gs://` prefix).
    """
    if getattr(backend, "scratch_dir", None):
        return backend.scratch_dir.rstrip("/")
    if os.environ.get("ZEPHYR_SCRATCH_DIR"):
        return os.environ["ZEPHYR_SCRATCH_DIR"].rstrip("/")
    directory = final_output_dir(plan)
    if directory is not None:
        return f"{directory}/.zephyr-scratch"
    return os.path.join(tempfile.gettempdir(), "zephyr-scratch")


def _roots(plan) -> list[str]:
    return [stage.sink.root for stage in plan.stages if isinstance(stage.sink, ScatterSink)]
