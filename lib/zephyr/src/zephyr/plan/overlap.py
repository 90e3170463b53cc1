"""Inputs and outputs of one pipeline must not overlap: checked when planning, before any task.

A pipeline that writes where its own source reads either replaces its input (`{basename}`
into the input folder: the original records are gone) or, on every rerun, reads its earlier
outputs as new input (`from_files("data/**/*.jsonl")` writing `data/clean/...`: doubled each
time; with `skip_existing`, an output first taken for input and then removed). So each output
path of every writer is checked against every input: the source's patterns and files (and a
`sorted_merge_join`'s right side's, however deep), by fsspec's glob semantics, so an output a
glob would match once it exists is caught on the first run too (`io.files.glob_matcher`).
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import Any

from fsspec.core import has_magic

from zephyr.errors import PlanError
from zephyr.io.files import file_location, glob_matcher
from zephyr.plan import ops as op
from zephyr.plan import shuffle_ops as sop
from zephyr.plan.sources import FilesSource

__all__ = ["check_overlap", "input_patterns"]


def input_patterns(dataset: Any) -> Iterator[tuple[str, str]]:
    """`(what, pattern)` for each place `dataset` reads files from: the patterns (or paths) of
    `from_files`, the path items of `from_list` that a loader reads (`from_list(paths).load_jsonl()`),
    and the same of every `sorted_merge_join`'s right side."""
    source = dataset.source
    if isinstance(source, FilesSource):
        for pattern in source.patterns:
            yield source.describe(), pattern
    elif op.loader_reads_source(dataset.ops):
        for shard in source.shards:
            for item in shard:
                if isinstance(item, str):
                    yield f"{source.label} item", item
    for record in dataset.ops:
        if isinstance(record, sop.SortedMergeJoin):
            yield from input_patterns(record.right)


def check_overlap(inputs: Iterable[tuple[str, str]], outputs: Iterable[tuple[Any, str]]) -> None:
    """Raise PlanError naming the input and the output when an output path (`(writer record,
    path)`) is one of the inputs or one a glob among them matches (or will, once written).
    Input files are looked up by location, so many listed paths and outputs cost no more than
    one pass over each."""
    files: dict[tuple, tuple[str, str]] = {}
    globs = []
    for what, pattern in inputs:
        if has_magic(pattern):
            globs.append((what, pattern, glob_matcher(pattern)))
        files.setdefault(file_location(pattern), (what, pattern))  # a glob that matches nothing names itself
    if not files:  # items of from_list that no loader reads: no files are read
        return
    for record, path in outputs:
        location = file_location(path)
        found = files.get(location) if location[0] is not None else None
        if found is not None:
            _refuse(record, path, *found, replaces=not has_magic(found[1]))
        for what, pattern, matches in globs:
            if matches(path):
                _refuse(record, path, what, pattern, replaces=False)


def _refuse(record: Any, path: str, what: str, pattern: str, replaces: bool) -> None:
    how, harm = ("is", "replace its own input") if replaces else ("matches", "read its earlier outputs as new input on every rerun")
    raise PlanError(
        f"{record.describe()} writes {path!r}, which the pipeline's input {pattern!r} ({what}) {how}: "
        f"the run would {harm}. Write the outputs elsewhere, or narrow the input pattern so it cannot match them"
    )
