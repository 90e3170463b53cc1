"""What each dedup of a run removed: documents in, out and removed, per `deduplicate` and
`deduplicate_fuzzy`, for the end-of-run summary, the status page and the run record.

Tasks count with `count(what, n)` into counters named by the stage counting them
(`zephyr/dedup/stage<i>/documents_in`, `.../documents_out`, `.../duplicates`), so they travel
with shard results and scatter manifests like any counter (a resumed stage still counts once)
and two dedups of one pipeline never add up. The plan says which stages each dedup counts in
(`Plan.dedups`, a `DedupStages` each); `dedup_section` turns the counters into the report.
"""

from __future__ import annotations

from dataclasses import dataclass

from zephyr import counters

__all__ = ["DedupStages", "count", "counter_name", "dedup_section", "format_dedups"]

_PREFIX = "zephyr/dedup/"


@dataclass(frozen=True)
class DedupStages:
    """One dedup of a plan: its kind ("exact" or "fuzzy"), its op, and the stages where its
    documents are counted going in and coming out."""

    kind: str
    op: str
    stage_in: int
    stage_out: int


def counter_name(stage: int | str, what: str) -> str:
    """The counter of `what` ("documents_in", "documents_out", "duplicates") counted in `stage`."""
    return f"{_PREFIX}{stage if isinstance(stage, str) else f'stage{stage}'}/{what}"


def count(what: str, n: int) -> None:
    """Count `n` of `what` in the running task's stage (no-op outside a task)."""
    stage = counters.current_stage_name()
    if stage is not None and n:
        counters.increment(counter_name(stage, what), n)


def dedup_section(dedups: tuple[DedupStages, ...], counts: dict) -> list[dict]:
    """Per dedup: its op, kind, stages, documents in and out and removed (None where a stage's
    counts are missing, e.g. its outputs were kept by skip_existing and it did not run).
    For `annotate=True` nothing is removed: `duplicates` says how many were marked."""
    section = []
    for d in dedups:
        docs_in = counts.get(counter_name(d.stage_in, "documents_in"))
        docs_out = counts.get(counter_name(d.stage_out, "documents_out"))
        entry = {"op": d.op, "kind": d.kind, "stages": [d.stage_in, d.stage_out], "documents_in": docs_in,
                 "documents_out": docs_out,
                 "removed": docs_in - docs_out if docs_in is not None and docs_out is not None else None}
        if d.kind == "fuzzy":
            entry["duplicates"] = counts.get(counter_name(d.stage_out, "duplicates"), 0 if docs_out is not None else None)
        section.append(entry)
    return section


def format_dedups(section: list[dict]) -> list[str]:
    """Summary lines: one per dedup."""
    lines = []
    for d in section:
        figures = ", ".join(f"{'?' if d[k] is None else format(d[k], ',')} {k.replace('documents_', '')}"
                            for k in ("documents_in", "documents_out", "removed"))
        marked = f", {d['duplicates']:,} duplicates" if d.get("duplicates") is not None and d["duplicates"] != d["removed"] else ""
        lines.append(f"  dedup {d['op']} (stages {d['stages'][0]}-{d['stages'][1]}): documents {figures}{marked}")
    return lines
