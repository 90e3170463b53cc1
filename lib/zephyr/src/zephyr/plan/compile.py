"""Dataset -> Plan: fuse per-item ops into stages, cut a stage at every shuffle.

A stage is data: its index, its input (source shards, or the output of a shuffle), the fused
chain of per-item ops every shard runs, and its sink (collect results, or scatter for the next
stage). `describe()` prints it; `--dry-run` prints it for every pipeline a script executes.
Each stage's chain goes through `pushdown.push_down`, so a select or expression filter right
after a loader is read by the loader itself; `approx_shard_bytes=N` on the loader right after
the source sizes the first stage's shards by bytes (`zephyr.plan.sizing`: small files packed,
large ones cut), which the stage's description shows.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from zephyr.plan import ops as op
from zephyr.plan import shuffle_ops as sop
from zephyr.errors import PlanError
from zephyr.plan.fingerprint import Identity, fingerprint, identify
from zephyr.plan.batch_span import plan_labels
from zephyr.plan.column_check import check_columns
from zephyr.plan.pushdown import push_down
from zephyr.plan.rounds import Rounds, round_reader
from zephyr.shuffle.reduce import Concatenate, FirstPerKey, HashPartition, ReduceGroups, RoundRobin, ScatterSink, ShuffleReader, keep_first
from zephyr.plan.sizing import Sizing, size_shards
from zephyr.plan.sources import SourceShard, resolve_source, with_path_versions
from zephyr.io.formats import format_for
from zephyr.shuffle.join import BoundJoin
from zephyr.plan.join_shuffled import join_shuffled
from zephyr.plan.overlap import check_overlap, input_patterns
from zephyr.dedup import components, fuzzy
from zephyr.dedup.report import DedupStages
from zephyr.naming import callable_name

__all__ = ["Plan", "Stage", "check_writers", "compile_plan", "shard_input_paths", "stage_output_path", "stage_output_paths"]


@dataclass(frozen=True)
class Stage:
    """One round of tasks, one per shard, each running the same fused op chain."""

    index: int
    ops: tuple
    num_shards: int
    input: Any  # a tuple of SourceShard for source stages; a shuffle reader otherwise
    sink: Any = None  # None: results go back to the driver; otherwise a shuffle writer
    input_label: str = ""
    fingerprint: str = ""  # covers the source and every op up to and including this stage
    # why a rerun cannot reuse this stage's work ('' when it can; see `fingerprint.identify`)
    not_resumable: str = ""
    rounds: Rounds | None = None  # a round of a GroupByRounds: the runner may add the next (`zephyr.plan.rounds`)

    def describe(self) -> str:
        label = self.input_label
        if getattr(self.input, "kept_whole", ""):
            label += f" (never cut into key ranges for skew: {self.input.kept_whole})"
        chain = " -> ".join([label] + plan_labels(self.ops, self.sink, [o.describe() for o in self.ops]))
        sink = f" => {self.sink.describe()}" if self.sink is not None else ""
        rounds = f" ({self.rounds.describe()})" if self.rounds is not None else ""
        return f"stage {self.index} [{self.num_shards} shards]: {chain}{sink}{rounds}"


@dataclass(frozen=True)
class Plan:
    stages: tuple[Stage, ...]
    fingerprint: str = field(default="")
    dedups: tuple[DedupStages, ...] = ()  # where each dedup counts its documents (`zephyr.dedup.report`)

    @property
    def num_shards(self) -> int:
        return self.stages[-1].num_shards

    def not_resumable(self) -> list[dict]:
        """`{stage, reason}` for each scatter stage whose work a rerun cannot reuse."""
        return [{"stage": s.index, "reason": s.not_resumable} for s in self.stages if s.sink is not None and s.not_resumable]

    def describe(self) -> str:
        head = f"Plan: {len(self.stages)} stage(s), {self.num_shards} output shard(s)"
        return "\n".join([head] + ["  " + s.describe() for s in self.stages])


# The layout and encodings of scatter output (runs, manifests, key bytes). Part of every
# fingerprint: a zephyr that writes or hashes them differently never resumes another's scratch
# (2: keys told apart by type, issue 21; 3: namedtuple keys by their fields, other objects' keys
# pickled without the memo; 4: runs of stages that read a shuffle hold each record's origin,
# `zephyr.shuffle.origin`, and fuzzy dedup's ids and blocks carry it; 5: key hashes are seeded
# xxHash64 of the key bytes, `zephyr.shuffle.keys`, where they were CRC-32 through splitmix64).
SCRATCH_FORMAT = 5


def compile_plan(dataset) -> Plan:
    """Resolve the source and fuse ops into stages, cutting at every shuffle.

    Validates writers against shard counts, outputs against the inputs (`plan.overlap`), join
    inputs against each other and the columns ops name against what their input has
    (`column_check`: reads the first input file's schema for Parquet and Vortex); runs no user
    code but callable output patterns.
    """
    shards, sizing = _sized(_versioned(resolve_source(dataset.source), dataset.ops), dataset.ops)
    check_columns(dataset.ops, shards[0].items[0] if shards and shards[0].items else None)
    stages: list[Stage] = []
    current: list = []
    num_shards = len(shards)
    stage_input: Any = tuple(shards)
    label = dataset.source.describe() + (f" {sizing.describe()}" if sizing is not None else "")
    ident = identify(("format", SCRATCH_FORMAT), ("source", dataset.source), ("inputs", _inputs(shards, sizing)))
    before, shuffle = ident, None  # the identity before the last shuffle stage, and its record
    for record in dataset.ops:
        if isinstance(record, (sop.GroupBy, sop.GroupByRounds, sop.Deduplicate, sop.Reshard)):
            sink, reader = _shuffle_for(record, num_shards)
            chain = push_down(tuple(current))
            stage_input = _kept_whole(stage_input, chain)
            before, shuffle = ident, record
            ident = _identify_stage(ident, stage_input, chain, sink)
            if isinstance(stage_input, tuple) and chain and all(_parsed_json(o) for o in chain):
                sink = replace(sink, parsed_json=True)  # its items come straight from orjson.loads
            stages.append(Stage(len(stages), chain, num_shards, stage_input, sink, label, ident.digest, ident.reason))
            if isinstance(record, sop.GroupByRounds):
                ident, reader = _first_round(record, stages, ident, reader)
            current, num_shards, stage_input, label = [], sink.num_partitions, reader, reader.label
        elif isinstance(record, sop.SortedMergeJoin) and (joint := _joint_shuffle(record, stages, shuffle, current)):
            check_writers(stages[-1])
            _check_load_file_extensions(stages[-1])
            chain, stage_input, sink, reader = joint
            ident = _identify_stage(before, stage_input, chain, sink)
            stages[-1] = Stage(0, chain, len(stage_input), stage_input, sink, "two sides", ident.digest, ident.reason)
            ident = _identify_stage(ident, reader, (), None)
            current, num_shards, stage_input, label = [], sink.num_partitions, reader, reader.label
            shuffle = record  # its output is a join's, not a group_by's: no second joint shuffle
        elif isinstance(record, sop.SortedMergeJoin):
            current.append(_bind_join(record, num_shards))
        else:
            current.append(record)
    chain = push_down(tuple(current))
    stage_input = _kept_whole(stage_input, chain)
    ident = _identify_stage(ident, stage_input, chain, None)
    stages.append(Stage(len(stages), chain, num_shards, stage_input, None, label, ident.digest, ident.reason))
    for s in stages:
        check_writers(s, sizing if s.index == 0 and isinstance(s.input, tuple) else None)
        _check_load_file_extensions(s)
    check_overlap(input_patterns(dataset), _outputs(stages))
    return Plan(tuple(stages), ident.digest, _dedups(stages))


def _dedups(stages: list[Stage]) -> tuple[DedupStages, ...]:
    """Each deduplicate (a keep-first scatter and the stage that reads it) and deduplicate_fuzzy
    (its signature stage and the stage that applies its labels), in plan order."""
    found = []
    for stage in stages:
        partitioner = getattr(stage.sink, "partitioner", None)
        if getattr(partitioner, "combiner", None) is keep_first:
            found.append(DedupStages("exact", stages[stage.index + 1].input.label, stage.index, stage.index + 1))
        for record in stage.ops:
            if isinstance(record, op.MapShard) and isinstance(record.fn, fuzzy.Signatures):
                applied = next(s.index for s in stages[stage.index + 1 :] if _applies_labels(s))
                found.append(DedupStages("fuzzy", f"deduplicate_fuzzy({callable_name(record.fn.text)})", stage.index, applied))
    return tuple(found)


def _applies_labels(stage: Stage) -> bool:
    mode = getattr(stage.input, "mode", None)
    return getattr(getattr(mode, "reducer", None), "func", None) is components.apply_labels


def _first_round(record: sop.GroupByRounds, stages: list[Stage], ident: Identity, reader: ShuffleReader) -> tuple[Identity, ShuffleReader]:
    """Append round 1 of `record`: it reads the rounds' shuffle (`reader`) and writes it again;
    the runner adds rounds after it while the data needs them (`zephyr.plan.rounds`). Returns its
    identity and the reader of the stage after the rounds: `record.final` over the last one's output."""
    round_sink, final = _shuffle_for(record.final_op(), reader.num_partitions)
    ident = _identify_stage(ident, reader, (), round_sink)
    stages.append(Stage(len(stages), (), reader.num_partitions, reader, round_sink, reader.label, ident.digest, ident.reason,
                        Rounds(record)))
    return ident, final


def _outputs(stages: list[Stage]):
    """`(writer record, path)` for every file each writer of `stages` writes."""
    for stage in stages:
        for record in stage.ops:
            if isinstance(record, op.WRITE_OPS):
                for path in stage_output_paths(stage, record):
                    yield from ((record, written) for written in op.written_files(record, path))


# Ops that see a shard as a whole (its items together, or its index and count). A skewed
# partition cut into key ranges runs as several shards (`zephyr.shuffle.run_index`): each of
# these would see every range as a shard of its own, so their stage is never cut.
_WHOLE_SHARD_OPS = (op.MapShard, op.Window, op.WindowBy, op.TakePerShard, BoundJoin)


def _kept_whole(stage_input: Any, chain: tuple) -> Any:
    """A stage's shuffle reader, told to keep each partition one shard when an op of `chain`
    sees shards whole (a per-shard function, window or take, or an inline sorted_merge_join,
    which pairs shard i with the right side's shard i); the input as it is otherwise."""
    if not isinstance(stage_input, ShuffleReader) or stage_input.kept_whole:
        return stage_input
    seeing = next((o for o in chain if isinstance(o, _WHOLE_SHARD_OPS)), None)
    if seeing is None:
        return stage_input
    why = "sorted_merge_join pairs its shard i with the right side's shard i" if isinstance(seeing, BoundJoin) \
        else f"{seeing.describe()} sees each shard whole"
    return replace(stage_input, kept_whole=why)


def _identify_stage(previous: Identity, stage_input: Any, chain: tuple, sink: Any) -> Identity:
    """The stage's identity: the previous stage's (or the source's), its shuffle reader (the
    reducer and all) after a shuffle, its ops and its sink, each labelled for the log."""
    reader = _reader_of(stage_input)
    parts = [(reader.label, reader)] if reader is not None else []
    parts += [(o.describe(), o) for o in chain]
    if sink is not None:
        parts.append((sink.describe(), sink))
    return identify(*parts, after=previous)


def _versioned(shards: list[SourceShard], ops: tuple) -> list[SourceShard]:
    """`from_list` items that a loader reads as paths get their files' versions, as
    `from_files` shards have (see `SourceShard.version`): also where filters come before the
    loader (`from_list(paths).filter(...).load_jsonl()`), since what reaches it is some of those
    paths. Items a `map` makes into paths are not known until it runs, so they have none."""
    if op.loader_reads_source(ops) and shards and all(s.path is None for s in shards):
        return with_path_versions(shards)
    return shards


def _parsed_json(record) -> bool:
    """Whether a loader's records are exactly what orjson's parser made (a file path column
    is the caller's string, maybe a `str` subclass, so it does not count)."""
    return isinstance(record, op.LoadJsonl) and not record.include_file_paths


def _sized(shards: list[SourceShard], ops: tuple) -> tuple[list[SourceShard], Sizing | None]:
    """Apply `approx_shard_bytes` of the loader that reads the source's paths directly."""
    sizing = [(i, r) for i, r in enumerate(ops) if isinstance(r, op.LOAD_OPS) and r.approx_shard_bytes]
    if not sizing:
        return shards, None
    index, record = sizing[0]
    if index != 0 or len(sizing) > 1:
        raise PlanError(
            f"{record.describe()}: approx_shard_bytes packs and cuts input files into shards when planning, so the "
            "loader must directly follow the source: Dataset.from_files(...).load_jsonl(approx_shard_bytes=...)"
        )
    return size_shards(shards, record.approx_shard_bytes, record)


def _inputs(shards: Sequence[SourceShard], sizing: Sizing | None) -> list[tuple]:
    """What the plan's identity knows of each source shard: its label and its files' versions,
    and the files themselves where the label names only the first and last of a packed run."""
    if sizing is None:
        return [(s.label, s.version) for s in shards]
    return [(s.label, s.version) if len(s.items) == 1 else (s.label, s.version, fingerprint(s.items)) for s in shards]


def _reader_of(stage_input: Any) -> Any:
    """What a stage's data depends on besides its ops: the shuffle reader (reducer and all)
    for stages after a shuffle; the source, already in the fingerprint chain, for stage 0."""
    return None if isinstance(stage_input, tuple) else stage_input


def _shuffle_for(record, num_shards: int) -> tuple[ScatterSink, ShuffleReader]:
    if isinstance(record, sop.GroupByRounds):  # into round 1
        sink, _ = _shuffle_for(record.round_op(1), num_shards)
        return sink, round_reader(record, 1, sink.num_partitions)
    if isinstance(record, sop.Reshard):
        n = record.num_shards
        return ScatterSink(n, RoundRobin()), ShuffleReader(n, Concatenate(), record.describe())
    n = record.num_output_shards or max(num_shards, 1)
    if isinstance(record, sop.Deduplicate):
        # keep-first on the map side too: duplicates within a spill run never cross the shuffle,
        # and the run's first item (by position) is the one the reduce side would have kept
        return ScatterSink(n, HashPartition(record.key, combiner=keep_first)), ShuffleReader(n, FirstPerKey(), record.describe())
    partitioner = HashPartition(record.key, record.sort_by, record.combiner)
    reader = ShuffleReader(n, ReduceGroups(record.reducer), record.describe(), sorted_by_value=record.sort_by is not None)
    return ScatterSink(n, partitioner), reader


def _joint_shuffle(record: sop.SortedMergeJoin, stages: list, shuffle: Any, current: list):
    """For a join of two group_by outputs (each side a source stage and a group_by): the joint
    shuffle's stage 0 and reduce reader (`zephyr.plan.join_shuffled`); None for any other join."""
    if len(stages) != 1 or not isinstance(shuffle, sop.GroupBy) or not isinstance(stages[0].input, tuple):
        return None
    right_groups = [o for o in record.right.ops if isinstance(o, (sop.GroupBy, sop.Deduplicate, sop.Reshard))]
    if len(right_groups) != 1 or not isinstance(right_groups[0], sop.GroupBy):
        return None
    if any(isinstance(o, sop.SortedMergeJoin) for o in record.right.ops):
        return None  # the right side is a join's output: _bind_join says what to do

    return join_shuffled(record, stages[0], shuffle, current, compile_plan(record.right), right_groups[0])


def _bind_join(record: sop.SortedMergeJoin, num_shards: int):
    right = compile_plan(record.right)
    if len(right.stages) != 1:
        raise PlanError(
            f"sorted_merge_join: the right side has {len(right.stages)} stages; it must be a single-stage "
            "pipeline (write the shuffled side out first and join with from_files(...).load_*()), or, to join two "
            "group_by outputs, each side must be a source, per-item ops and one group_by (not a join's output)"
        )
    (stage,) = right.stages
    if stage.num_shards != num_shards:
        raise PlanError(
            f"sorted_merge_join needs co-partitioned inputs with equal shard counts; "
            f"left has {num_shards} shards, right has {stage.num_shards} ({stage.input_label})"
        )
    return BoundJoin(
        record, stage.ops, tuple(s.items for s in stage.input), tuple(s.label for s in stage.input), right.fingerprint
    )


def check_writers(stage: Stage, sizing: Sizing | None = None) -> None:
    """Writers of a stage must give each shard its own path, checked before anything runs:
    {shard} (or {basename} of distinct input files) in a string pattern, distinct answers
    from a callable one; {basename} needs one `from_files` input file per shard, so shards
    sized by bytes (`sizing`) have none."""
    for record in stage.ops:
        if not isinstance(record, op.WRITE_OPS):
            continue
        if isinstance(record.pattern, str):
            if "basename" in op.pattern_fields(record.pattern) and sizing is not None:
                raise PlanError(
                    f"Output pattern {record.pattern!r} uses {{basename}}, but approx_shard_bytes={sizing.approx_bytes} sizes "
                    "shards by bytes: a shard reads several small files packed together, or a piece of a large one, so it "
                    "has no one input file to name (and which it would be changes with the files' sizes); use {shard} "
                    "instead, e.g. 'out/part-{shard:05d}-of-{total:05d}.jsonl.zst'"
                )
            if "basename" in op.pattern_fields(record.pattern):
                _check_basename_inputs(stage, record.pattern)
            elif stage.num_shards > 1 and not op.has_shard_field(record.pattern):
                raise PlanError(
                    f"Output pattern must contain '{{shard}}' when writing {stage.num_shards} shards; "
                    f"got {record.pattern!r} (e.g. 'out/part-{{shard:05d}}-of-{{total:05d}}.jsonl.zst')"
                )
        _check_distinct_paths(stage, record)


def _check_distinct_paths(stage: Stage, record) -> None:
    """Two shards writing one path would silently keep only the last one written."""
    seen: dict[str, int] = {}
    for shard, path in enumerate(stage_output_paths(stage, record)):
        if path in seen:
            if callable(record.pattern):
                why = f"output path function {op.callable_name(record.pattern)}"
                fix = "return a different path for each shard (e.g. include the shard argument)"
            else:
                why = f"Output pattern {record.pattern!r}"
                fix = "their input files share a name, or one file was split into several shards: add {shard}"
            raise PlanError(f"{why} gives shards {seen[path]} and {shard} the same path {path!r}; {fix}")
        seen[path] = shard


def shard_input_paths(stage: Stage) -> list[str | None]:
    """Per shard, the `from_files` input file it reads (for `{basename}`); None where there is
    none (list items, or the output of a shuffle)."""
    if not isinstance(stage.input, tuple):
        return [None] * stage.num_shards
    return [shard.path for shard in stage.input]


def _check_basename_inputs(stage: Stage, pattern: str) -> None:
    for shard, path in enumerate(shard_input_paths(stage)):
        if path is None:
            source = "the output of a shuffle" if not isinstance(stage.input, tuple) else "items of from_list/from_iterable"
            raise PlanError(
                f"Output pattern {pattern!r} uses {{basename}}, which needs one input file per shard "
                f"(Dataset.from_files(...) before any shuffle); shard {shard} of stage {stage.index} reads {source}"
            )


def stage_output_paths(stage: Stage, record) -> list[str]:
    """The path writer `record` of `stage` writes for each shard (calls a callable pattern)."""
    inputs = shard_input_paths(stage)
    return [op.shard_output_path(record.pattern, i, stage.num_shards, inputs[i]) for i in range(stage.num_shards)]


def stage_output_path(stage: Stage, record, shard: int) -> str:
    """The path writer `record` of `stage` writes for one shard."""
    path = stage.input[shard].path if isinstance(stage.input, tuple) else None
    return op.shard_output_path(record.pattern, shard, stage.num_shards, path)


def _check_load_file_extensions(stage: Stage) -> None:
    """Fail before any task runs when `load_file()` reads paths straight from `from_files`."""
    if not stage.ops or not isinstance(stage.ops[0], op.LoadFile) or not isinstance(stage.input, tuple):
        return

    for shard in stage.input:
        for path in shard.items:
            if isinstance(path, str):
                format_for(path)
