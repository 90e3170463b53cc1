"""Which input made which output: the provenance of `skip_existing` outputs.

`skip_existing=True` keeps an existing output instead of recomputing it. Matching outputs to
shards by position alone loses data when the inputs change (add `a` before `b`, `c`: shard 0 is
now `a`, and its output, made from `b`, would be kept). So every output a `skip_existing`
writer makes gets a hidden sidecar, `.<name>.zephyr-source.json` beside it (hidden names are
never matched by zephyr's globs), recording what the shard read and which code wrote it:

- `input`: the identity of the shard's input now: a source shard's label and its files'
  version (`SourceShard.version`: size and generation/mtime); after a shuffle, the
  fingerprint of everything upstream (the inputs and code of the earlier stages) and the
  shard's number;
- `code`: the fingerprint of the ops up to the writer (and the shuffle's reducer);
- `writer`: the output pattern, so a later run knows which outputs it made;
- `sizes`: added once the output is written, the size of each file the writer made, so an
  output cut short or rewritten since is made again.

A shard keeps its existing output only when the recorded input equals its input now (and the
files still have their recorded sizes).
Recorded by other code, same input: kept (rerunning after a fix is what skip_existing is
for), counted and logged once. No sidecar (an older zephyr, or written by hand): kept, as
before, with a warning. Outputs this writer made that no shard of the current plan writes (an
input was removed, the shard count changed) stop the run before anything runs
(`StaleOutputsError`), naming them and the inputs they were made from; after a shuffle that skew
may cut into more shards than planned, before that stage runs, once its shard count is known.
A rerun of such a stage whose outputs are all there finds its shard count in their sidecars
(`recorded_shard_count`), so it runs nothing upstream, as any other.

Order of writing, safe against a kill at any moment: remove the old output, write the
sidecar, write the output (atomically). An output therefore never sits beside provenance
that is not its own; a sidecar without its output is harmless (the output is computed).
Where the sidecar there already records this input, code and writer, the output beside it was
made from this input after that claim (another attempt of this shard: a straggler's second
attempt, or the first one it copies), so it is neither removed nor its sidecar rewritten: a
losing attempt never deletes the winner's output, and its own write replaces it atomically
with the same content.
"""

from __future__ import annotations

import glob
import logging
import posixpath
import string
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass

import orjson
from fsspec.implementations.local import LocalFileSystem

from zephyr import counters
from zephyr.plan import ops as op
from zephyr.errors import PlanError
from zephyr.plan.fingerprint import fingerprint
from zephyr.io.files import atomic_write, url_to_fs
from zephyr.plan.compile import stage_output_paths

__all__ = [
    "SIDECAR_SUFFIX",
    "ShardSource",
    "StaleOutputsError",
    "claim_output",
    "existing_output_kept",
    "outputs_current",
    "record_output_sizes",
    "recorded_shard_count",
    "refuse_stale_outputs",
    "report_kept",
    "shard_source",
    "sidecar_path",
    "writer_codes",
]

logger = logging.getLogger("zephyr")

SIDECAR_SUFFIX = ".zephyr-source.json"
KEPT_OTHER_CODE = "zephyr/outputs_kept_other_code"
KEPT_UNKNOWN = "zephyr/outputs_kept_without_provenance"


class StaleOutputsError(PlanError):
    """skip_existing found outputs of an earlier run that this run would not write."""


@dataclass(frozen=True)
class ShardSource:
    """What one shard reads, as its outputs' sidecars record it."""

    input: str  # identity: changes whenever the shard's input data may have changed
    label: str  # for people: the input file, or the shard of the shuffle
    upstream: str = ""  # after a shuffle: the fingerprint of the stage before


def sidecar_path(output: str) -> str:
    head, sep, name = output.rpartition("/")
    return f"{head}{sep}.{name}{SIDECAR_SUFFIX}"


def _output_of(sidecar: str) -> str:
    head, sep, name = sidecar.rpartition("/")
    return f"{head}{sep}{name[1 : -len(SIDECAR_SUFFIX)]}"


def writer_id(record) -> str:
    pattern = record.pattern
    return pattern if isinstance(pattern, str) else f"function {op.callable_name(pattern)}"


# ---- identities (the driver computes them; tasks carry them) ------------------------------------


def shard_source(stages, stage, shard: int, num_shards: int) -> ShardSource:
    """The input identity of `shard` of `stage` (of the plan's `stages`)."""
    if isinstance(stage.input, tuple):
        source = stage.input[shard]
        if source.path is not None:  # from_files: the path, and what the file holds
            return ShardSource(f"{source.label}@{source.version}", source.label)
        # from_list: the items themselves (paths a loader reads, with their files' versions)
        return ShardSource(f"items:{fingerprint(source.items)}@{source.version}", source.label)
    upstream = stages[stage.index - 1].fingerprint
    label = f"shard {shard} of {num_shards} after {stage.input_label}"
    return ShardSource(f"{upstream}:{shard}/{num_shards}", label, upstream)


def writer_codes(stage) -> tuple[tuple[int, str], ...]:
    """(op index, code fingerprint) of each skip_existing writer of `stage`."""
    reader = None if isinstance(stage.input, tuple) else stage.input
    return tuple(
        (i, fingerprint(("code", reader, stage.ops[: i + 1])))
        for i, record in enumerate(stage.ops)
        if isinstance(record, op.WRITE_OPS) and record.skip_existing
    )


# ---- in the task ----------------------------------------------------------------------------------


def _read_json(path: str) -> dict | None:
    fs, fs_path = url_to_fs(path)
    try:
        return orjson.loads(fs.cat_file(fs_path))
    except FileNotFoundError:
        return None
    except orjson.JSONDecodeError:
        return {}  # a damaged sidecar proves nothing: recompute


def existing_output_kept(path: str, source: ShardSource, code: str) -> bool:
    """Whether the existing output at `path` may stand for a shard reading `source` (and is
    still the size it was written at: a truncated or rewritten output is made again)."""
    recorded = _read_json(sidecar_path(path))
    fs, fs_path = url_to_fs(path)
    if not fs.exists(fs_path):
        return False
    if recorded is None:
        counters.increment(KEPT_UNKNOWN)
        return True
    if recorded.get("input") != source.input:
        return False
    if not _sizes_match(fs, fs_path, recorded.get("sizes") or {}):
        logger.warning("zephyr: %s is not the size it was written at; making it again", path)
        return False
    if recorded.get("code") != code:
        counters.increment(KEPT_OTHER_CODE)
    return True


def claim_output(record, path: str, source: ShardSource, code: str) -> dict:
    """Before a skip_existing writer writes `path`: remove the old output, then record where
    the new one comes from (see the module docstring for why in this order, and why an output
    claimed for this very input and code already is left alone); the sidecar claimed."""
    sidecar = {"writer": writer_id(record), "input": source.input, "label": source.label, "upstream": source.upstream, "code": code}
    recorded = _read_json(sidecar_path(path))
    if recorded and all(recorded.get(k) == v for k, v in sidecar.items()):
        return sidecar
    fs, fs_path = url_to_fs(path)
    try:
        fs.rm_file(fs_path)
    except FileNotFoundError:
        pass
    _write_sidecar(path, sidecar)
    return sidecar


def record_output_sizes(path: str, sidecar: dict, sizes: dict[str, int]) -> None:
    """After a skip_existing writer wrote `path` (and files beside it): rewrite its `sidecar`
    (as `claim_output` wrote it) with their sizes, by name. A kill before this leaves a sidecar
    without sizes, judged as before."""
    _write_sidecar(path, {**sidecar, "sizes": {posixpath.basename(written): size for written, size in sizes.items()}})


def _write_sidecar(path: str, sidecar: dict) -> None:
    with atomic_write(sidecar_path(path), remove_stale=False) as f:
        f.write(orjson.dumps(sidecar))


def _sizes_match(fs, fs_path: str, sizes: dict) -> bool:
    """Whether each file the sidecar names (beside `fs_path`) still has its recorded size."""
    folder = posixpath.dirname(fs_path)
    for name, size in sizes.items():
        try:
            if int(fs.size(posixpath.join(folder, name) if folder else name)) != size:
                return False
        except FileNotFoundError:
            return False
    return True


def report_kept(totals) -> None:
    """One warning per run for outputs kept without knowing they match (counters from the tasks)."""
    if totals.get(KEPT_OTHER_CODE):
        logger.warning("zephyr: %d existing output(s) were made by other code from the same input; skip_existing keeps "
                       "them (delete them to recompute)", totals[KEPT_OTHER_CODE])
    if totals.get(KEPT_UNKNOWN):
        logger.warning("zephyr: %d existing output(s) have no record of the input they were made from (written by an "
                       "older zephyr or by hand); skip_existing keeps them as they are", totals[KEPT_UNKNOWN])


# ---- in the driver, before anything runs --------------------------------------------------------


@dataclass
class _Survey:
    """What one output directory holds: its file names and the sidecars found there."""

    files: dict[str, int | None]  # path (filesystem form) -> size
    sidecars: dict[str, dict]  # output path (filesystem form) -> its sidecar


def _survey(directories: set[str], fs) -> dict[str, _Survey]:
    """One listing per directory, then every sidecar there read (concurrently)."""

    def one(directory: str) -> _Survey:
        fs.invalidate_cache(directory)  # another process may have written there since
        try:
            listing = {entry["name"]: entry.get("size") for entry in fs.ls(directory, detail=True)}
        except FileNotFoundError:
            return _Survey({}, {})
        names = set(listing)
        sidecars = sorted(n for n in names if n.rsplit("/", 1)[-1].startswith(".") and n.endswith(SIDECAR_SUFFIX))
        # `cat_ranges`, not `cat`: `cat` globs names holding "[", "*" or "?" (an `out[1]/` folder)
        contents = fs.cat_ranges(sidecars, None, None, on_error="return") if sidecars else []
        parsed = {}
        for name, data in zip(sidecars, contents):
            try:
                if not isinstance(data, Exception):
                    parsed[_output_of(fs._strip_protocol(name))] = orjson.loads(data)
            except orjson.JSONDecodeError:
                continue
        return _Survey({fs._strip_protocol(n): size for n, size in listing.items()}, parsed)

    ordered = sorted(directories)
    with ThreadPoolExecutor(max_workers=min(16, max(1, len(ordered)))) as pool:
        return dict(zip(ordered, pool.map(one, ordered)))


def _planned(stage, record) -> tuple:
    """(filesystem, {output path in the filesystem's form: shard}) of one writer."""
    paths = stage_output_paths(stage, record)
    fs, _ = url_to_fs(paths[0])
    return fs, {fs._strip_protocol(p): i for i, p in enumerate(paths)}


def refuse_stale_outputs(stages, cut=None) -> None:
    """Raise StaleOutputsError when a skip_existing writer's directory holds outputs it made
    earlier that no shard of this plan writes (their output present: keeping them would leave
    data of removed or regrouped inputs among the outputs). Sidecars whose output is gone are
    removed (litter, e.g. after the user deleted such outputs).

    Before the run (`cut` None), a stage that skew may cut into more shards than planned
    (`ShuffleReader.may_cut`) does not know yet which outputs it writes: its writers' outputs
    made after a shuffle are judged once its shards are known, before it runs (`cut`: that
    stage, at its shard count then)."""
    for stage in stages if cut is None else [cut]:
        later = cut is None and getattr(stage.input, "may_cut", False)
        for index, _ in writer_codes(stage):
            record = stage.ops[index]
            if stage.num_shards == 0:
                continue
            fs, planned = _planned(stage, record)
            surveys = _survey(_written_directories(record, planned, fs), fs)
            stale = []
            for survey in surveys.values():
                for output, sidecar in sorted(survey.sidecars.items()):
                    if output in planned or sidecar.get("writer") != writer_id(record):
                        continue
                    if later and sidecar.get("upstream"):
                        continue  # made after a shuffle: judged once this run's shard count is known
                    if output not in survey.files:
                        fs.rm_file(sidecar_path(output))
                        continue
                    stale.append((output, sidecar.get("label", "?")))
            if stale:
                raise StaleOutputsError(_stale_message(record, stale, fs))


def _written_directories(record, planned: dict[str, int], fs) -> set[str]:
    """The directories where this writer's earlier outputs may be: those of this plan's outputs
    and, when a field names a directory (`out/{shard}/part.jsonl`), every directory holding a
    sidecar of this pattern (one glob), since a removed input's output is then in a directory
    no shard of this plan writes."""
    directories = {p.rsplit("/", 1)[0] for p in planned}
    pattern = record.pattern
    if callable(pattern) or not op.pattern_fields(pattern.rpartition("/")[0]):
        return directories
    pieces = [glob.escape(text) + ("*" if field is not None else "") for text, field, _, _ in string.Formatter().parse(pattern)]
    wildcard = fs._strip_protocol("".join(pieces))
    fs.invalidate_cache()  # another process may have written there since
    return directories | {found.rsplit("/", 1)[0] for found in fs.glob(sidecar_path(wildcard))}


def _stale_message(record, stale: list[tuple[str, str]], fs) -> str:
    shown = "; ".join(f"{o if isinstance(fs, LocalFileSystem) else fs.unstrip_protocol(o)} (made from {label})" for o, label in stale[:10])
    more = f"; and {len(stale) - 10} more" if len(stale) > 10 else ""
    return (
        f"{record.describe()}: {len(stale)} output(s) of an earlier run would not be written by this run, whose inputs "
        f"changed (an input was removed, the number of shards changed, or skew cut a partition into fewer key ranges): "
        f"{shown}{more}. Keeping them would leave "
        "data of inputs that are gone, or are now in other shards, among the outputs. Delete those outputs (the run "
        "removes their hidden .zephyr-source.json records itself) or write to another directory, then rerun."
    )


def recorded_shard_count(stages, stage) -> int | None:
    """The shard count recorded by the outputs of `stage`'s last skip_existing writer made from
    the same shuffle as now, when it is more than planned: skew cut that shuffle's partitions
    into key ranges (`ShuffleReader.may_cut`), the same ones every run. None otherwise."""
    codes = writer_codes(stage)
    if not codes or not getattr(stage.input, "may_cut", False) or stage.num_shards == 0:
        return None
    record = stage.ops[codes[-1][0]]
    fs, planned = _planned(stage, record)
    upstream = stages[stage.index - 1].fingerprint
    counts = {sidecar.get("input", "").rpartition("/")[2]
              for survey in _survey(_written_directories(record, planned, fs), fs).values()
              for sidecar in survey.sidecars.values()
              if sidecar.get("writer") == writer_id(record) and sidecar.get("upstream") == upstream}
    count = int(counts.pop()) if len(counts) == 1 and next(iter(counts)).isdigit() else 0
    return count if count > stage.num_shards else None


def outputs_current(stages, stage) -> bool:
    """True when the last skip_existing writer of `stage` has every shard's output, each made
    from the shard's input now (or of unknown origin: kept, as skip_existing always did).

    One listing per output directory and the sidecars there, read concurrently.
    """
    codes = writer_codes(stage)
    if not codes or stage.num_shards == 0:
        return False
    record = stage.ops[codes[-1][0]]
    fs, planned = _planned(stage, record)
    surveys = _survey({p.rsplit("/", 1)[0] for p in planned}, fs)
    for path, shard in planned.items():
        survey = surveys[path.rsplit("/", 1)[0]]
        if path not in survey.files:
            return False
        sidecar = survey.sidecars.get(path)
        if sidecar is not None and sidecar.get("input") != shard_source(stages, stage, shard, stage.num_shards).input:
            return False
        folder = path.rsplit("/", 1)[0]
        for name, size in (sidecar or {}).get("sizes", {}).items():  # a truncated or rewritten output
            if survey.files.get(f"{folder}/{name}") != size:
                return False
    return True
