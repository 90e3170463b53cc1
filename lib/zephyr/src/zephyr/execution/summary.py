"""The end-of-run summary the `zephyr` command prints: per-stage times, items, retries, counters."""

from __future__ import annotations

from zephyr.counters import public
from zephyr.dedup.report import dedup_section, format_dedups
from zephyr.engine.frame import PYTHON_COLUMN
from zephyr.engine.scan import SCAN_FALLBACKS
from zephyr.execution.progress import format_largest
from zephyr.execution.runner import Execution
from zephyr.status.costs import cost_line
from zephyr.status.crashes import describe_crash

__all__ = ["format_summary", "quarantine_lines"]


def format_summary(execution: Execution) -> str:
    """Per-stage times and items, and the counters, as a short block of text."""
    lines = [f"zephyr: finished in {execution.elapsed:.2f}s on {execution.backend.describe()}"]
    for s in execution.stats:
        retries = ""
        # attempts run again (a lost attempt after which the shard was quarantined or the run
        # failed is in `retries_lost` but was not retried)
        lost = s.cost.retries.get("lost", 0) + s.cost.retries.get("storage", 0)
        if s.retries_user or lost:
            retries = f", retried {s.retries_user} failed / {lost} lost"
        quarantined = f", {s.quarantined} QUARANTINED" if getattr(s, "quarantined", 0) else ""
        copied = f", {s.speculated} straggler(s) given a second attempt ({s.won_by_copy} won by it)" if s.speculated else ""
        lines.append(f"  stage {s.index}: {s.num_shards} shards, {s.items_out} items back, {s.elapsed:.2f}s{retries}{quarantined}{copied}")
        cost = cost_line(s.cost.to_dict(getattr(execution.backend, "price_per_core_hour", None)))
        if cost:
            lines.append(f"    {cost}")
        if s.largest_partitions:
            lines.append(f"    largest partitions: {format_largest(s.largest_partitions)}")
    lines.extend(format_dedups(dedup_section(execution.plan.dedups, execution.counters)))
    for item in execution.plan.not_resumable():
        lines.append(f"  not resumable: stage {item['stage']} (a failed run would redo it): {item['reason']}")
    lines.extend(engine_lines(execution.counters))
    shown = public(execution.counters)  # without the aggregation companions, as the status and the record show them
    if shown:
        lines.append("  counters:")
        width = max(len(k) for k in shown)
        for name in sorted(shown):
            lines.append(f"    {name:<{width}}  {shown[name]:,}")
    lines.extend(quarantine_lines(getattr(execution, "quarantine", None)))
    for crash in execution.status.crashes:
        lines.append(f"  CRASHED during the run: {describe_crash(crash)}")
    if getattr(execution, "run_record", None):
        lines.append(f"  run record: {execution.run_record} (zephyr status / zephyr dashboard DIR)")
    return "\n".join(lines)


def engine_lines(counters: dict) -> list[str]:
    """What ran in Python where the engine could not hold the data exactly, said in words."""
    lines = []
    for name in sorted(k for k in counters if k.startswith(PYTHON_COLUMN)):
        lines.append(f"  in Python, not the engine: column {name[len(PYTHON_COLUMN):]!r} held values of several kinds "
                     f"(an int beside a str or a bool, an integer beyond 64 bits, nested values) in {counters[name]:,} block(s)")
    if counters.get("zephyr/python_expressions"):
        lines.append(f"  in Python, not the engine: {counters['zephyr/python_expressions']:,} block(s) of an expression Polars "
                     "could compute otherwise (types it cannot hold exactly, integer arithmetic, nested fields)")
    if counters.get(SCAN_FALLBACKS):
        lines.append(f"  parsed by orjson, not the engine's scan: {counters[SCAN_FALLBACKS]:,} block(s) of JSON lines its reader "
                     "could not read exactly (the log names each file's first and why)")
    return lines


def quarantine_lines(quarantine) -> list[str]:
    """The quarantine report: each shard set aside, its source and its error (none: no lines)."""
    if not quarantine:
        return []
    lines = [f"  QUARANTINED {len(quarantine.shards)} shard(s) (failed on every attempt; the run exits non-zero; "
             "rerun to retry only them):"]
    for q in sorted(quarantine.shards, key=lambda q: (q.stage, q.shard)):
        lines.append(f"    {q.describe()}")
    return lines
