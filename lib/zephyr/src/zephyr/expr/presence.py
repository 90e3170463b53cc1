"""Columns no record had: the check at run time for inputs without a schema (JSON Lines, records).

A column expression, a `select` or a loader's folded filter or projection that names a column
(or nested field) which no record of its input has reads null for every record: a misspelt
name (`col("scroe")`) silently filters everything away. Where the input has a typed schema
(Parquet, Vortex), the planner refuses such a name before anything runs
(`zephyr.plan.column_check`). JSON Lines records may differ in their keys, so a name some
records lack is no error there; instead each run of column ops watches its input
(`zephyr.plan.ops.watch_points`) until every path it reads has been seen once, and a shard
whose input ends with a path never seen (after at least one record) is counted under
`zephyr/missing_column/<path>` (a nested field as `meta.x`; a Parquet or Vortex file read
without it counts too). When the run ends, the runner warns, naming the ops that read it
(`warn_missing_columns`).

Watching costs ~0.2 µs a record while a path is unseen and nothing measurable after: the
generator that looks stops there, and the rest of the stream is chained on in C
(`itertools.chain`; `benchmarks/bench_column_watch.py`).
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Callable, Iterable, Iterator
from typing import Any

from zephyr import counters
from zephyr.expr.nodes import referenced_fields

__all__ = ["MISSING_COLUMN", "note_missing", "note_missing_from_file", "path_name", "record_has", "schema_has", "watched",
           "warn_missing_columns"]

MISSING_COLUMN = "zephyr/missing_column/"  # + the path: shards (Parquet, Vortex: files) in which no record had it

logger = logging.getLogger("zephyr")

Path = tuple[str, ...]


def path_name(path: Path) -> str:
    """`("meta", "x")` -> `meta.x`: how a path is named in counters and messages."""
    return ".".join(path)


def record_has(record: Any, path: Path) -> bool:
    """Whether a record has the column `path` (each name a key of a dict, the value may be None)."""
    value = record
    for name in path:
        if not isinstance(value, dict) or name not in value:
            return False
        value = value[name]
    return True


def schema_has(schema: Any, path: Path) -> bool:
    """Whether a `pyarrow.Schema` has the column `path` (nested names as struct fields)."""
    import pyarrow.types as pt

    if path[0] not in schema.names:
        return False
    kind = schema.field(path[0]).type
    for name in path[1:]:
        if not pt.is_struct(kind) or kind.get_field_index(name) < 0:
            return False
        kind = kind.field(name).type
    return True


def note_missing(paths: Iterable[Path]) -> None:
    """Count each path as missing from the input of the shard being run."""
    for path in paths:
        counters.increment(MISSING_COLUMN + path_name(path))


def note_missing_from_file(schema: Any, columns: Iterable[str] | None, filter: Any) -> None:
    """Count the columns a file's `pyarrow.Schema` lacks of those a reader was asked for (a
    projection's, a filter's paths): a typed file has what its schema says, whatever its rows."""
    paths = {(c,) for c in columns or ()} | (referenced_fields(filter) if filter is not None else set())
    note_missing(path for path in paths if not schema_has(schema, path))


def watched(stream: Iterable[Any], paths: Iterable[Path],
            missing_in: Callable[[Any, set], tuple[set, bool]] | None = None) -> Iterator[Any]:
    """`stream` unchanged; once it ends, counts each of `paths` no item had (see the module doc).

    Items are records, or with `missing_in(item, missing)` (the paths of `missing` the item
    lacks, and whether it held a record at all) anything else: the batch path's blocks of rows."""
    paths = set(paths)
    if not paths:
        return iter(stream)
    items = iter(stream)
    watch = _until_seen(items, paths, missing_in) if missing_in is not None else _until_seen_records(items, paths)
    return itertools.chain(watch, items)


def _until_seen_records(records: Iterator[Any], paths: set) -> Iterator[Any]:
    """`_until_seen` for records, at about 0.2 µs a record while a column is unseen: top-level
    names leave the set in C (`set.difference` of a dict looks each name up in it)."""
    names = {path[0] for path in paths if len(path) == 1}
    nested = {path for path in paths if len(path) > 1}
    saw_records = False
    for record in records:
        saw_records = True
        yield record
        if isinstance(record, dict):
            names = names.difference(record) if names else names
            nested = {path for path in nested if not record_has(record, path)} if nested else nested
        if not names and not nested:
            return  # every path seen: `watched` chains the rest on as it is
    if saw_records:
        note_missing({(name,) for name in names} | nested)


def _until_seen(items: Iterator[Any], missing: set, missing_in) -> Iterator[Any]:
    saw_records = False
    for item in items:
        missing, held = missing_in(item, missing)
        saw_records = saw_records or held
        yield item
        if not missing:
            return  # every path seen: `watched` chains the rest on as it is
    if saw_records:
        note_missing(missing)


def warn_missing_columns(totals: dict, ops: Iterable[Any]) -> None:
    """One warning per column counted missing in a run, naming the ops (of `ops`) that read it."""
    for name in sorted(k for k in totals if k.startswith(MISSING_COLUMN) and totals[k]):
        column = name[len(MISSING_COLUMN):]
        readers = sorted({o.describe() for o in ops if column in {path_name(p) for p in _reads(o)}})
        logger.warning("zephyr: no record had column %r in %d shard(s) or file(s) where %s reads it: it read as null "
                       "there (a select leaves it out); is the name misspelt? (counted in %s)", column, totals[name],
                       " and ".join(readers) or "an op", name)


def _reads(record: Any) -> set:
    reads = getattr(record, "reads", None)
    return reads() if callable(reads) else set()
