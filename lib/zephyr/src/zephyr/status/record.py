"""The run record: a finished run's final snapshot, written beside its outputs.

`<output directory>/.zephyr-run.json` (the directory of the final writer's first output), so that
`zephyr status DIR` or `zephyr dashboard DIR` shows the run after its driver is gone. A run
that returns its results to the driver instead of writing files has no record.
"""

from __future__ import annotations

import logging
import posixpath

import orjson

from zephyr.plan.ops import WRITE_OPS
from zephyr.io.files import atomic_write
from zephyr.io.files import url_to_fs
from zephyr.plan.compile import stage_output_path

__all__ = ["RECORD_NAME", "final_output_dir", "read_run_record", "record_path_for", "write_run_record"]

RECORD_NAME = ".zephyr-run.json"
logger = logging.getLogger("zephyr")


def final_output_dir(plan) -> str | None:
    """The directory of the first output file of the plan's final writer, or None (no writer,
    or no shards). Scratch (`.zephyr-scratch`) and the run record go there."""
    final = plan.stages[-1]
    for record in reversed(final.ops):
        if isinstance(record, WRITE_OPS) and final.num_shards:
            first = stage_output_path(final, record, 0)
            return first.rsplit("/", 1)[0] if "/" in first else "."
    return None


def record_path_for(plan) -> str | None:
    """Where a run of `plan` leaves its record: beside its final writer's outputs, or None."""
    directory = final_output_dir(plan)
    return None if directory is None else f"{directory}/{RECORD_NAME}"


def write_run_record(snapshot: dict, path: str) -> bool:
    """Write `snapshot` to `path` atomically, removing what killed runs' writes of it left;
    a failure is logged, never raised (the run is done)."""
    try:
        with atomic_write(path) as f:
            f.write(orjson.dumps(snapshot, option=orjson.OPT_INDENT_2))
        return True
    except Exception as e:  # noqa: BLE001 - the record is a report; losing it must not fail a finished run
        logger.warning("zephyr: could not write the run record %s: %s: %s", path, type(e).__name__, e)
        return False


def read_run_record(location: str) -> dict:
    """A run record from a file or a directory holding one (local or any fsspec URL).

    Raises FileNotFoundError naming the path, ValueError if it is not a run record.
    """
    fs, path = url_to_fs(location)
    if fs.isdir(path):
        location = posixpath.join(location.rstrip("/"), RECORD_NAME)
        fs, path = url_to_fs(location)
    if not fs.exists(path):
        raise FileNotFoundError(f"no run record at {location}")
    try:
        snapshot = orjson.loads(fs.cat_file(path))
    except orjson.JSONDecodeError as e:
        raise ValueError(f"{location} is not a zephyr run record (invalid JSON: {e})") from None
    if not isinstance(snapshot, dict) or not str(snapshot.get("schema", "")).startswith("zephyr-run/"):
        raise ValueError(f"{location} is not a zephyr run record (no 'schema': 'zephyr-run/...')")
    return snapshot
