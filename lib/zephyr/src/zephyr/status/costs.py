"""What each stage cost, as text: one line per stage for `zephyr status` and the run summary,
and two runs side by side (`zephyr status --compare A B`).

Both read the `cost` dict of a snapshot's stage (`zephyr.cost.StageCost.to_dict`); records
written before costs were measured have none and show nothing.
"""

from __future__ import annotations

from zephyr.cost import RETRY_CAUSES
from zephyr.resources import format_bytes

__all__ = ["COMPARED", "compare_runs", "cost_line", "format_comparison"]


def cost_line(cost: dict | None) -> str | None:
    """`cost` (a stage's) as one line, or None when the stage has none (or nothing ran yet)."""
    if not cost or not (cost.get("tasks") or any((cost.get("retries") or {}).values())):
        return None
    peak = format_bytes(cost["peak_rss"]) + (" (process, shared by its tasks)" if cost.get("peak_rss_shared") else "")
    retries = cost.get("retries") or {}
    parts = [f"cpu {cost['cpu_s']:,.1f}s over {cost['tasks']:,} tasks ({cost['task_s']:,.1f}s busy)", f"peak rss {peak}",
             f"read {_read(cost)} / wrote {format_bytes(cost['bytes_written'])}"]
    if cost["shuffle_bytes_written"] or cost["shuffle_bytes_read"]:
        parts.append(f"shuffle {format_bytes(cost['shuffle_bytes_written'])} out / {format_bytes(cost['shuffle_bytes_read'])} in")
    if any(retries.values()):
        parts.append("retries " + ", ".join(f"{retries.get(c, 0)} {c}" for c in RETRY_CAUSES))
    if cost.get("memory_budget"):
        parts.append(f"budget {format_bytes(cost['memory_budget'])}")
    if cost.get("cost") is not None:
        parts.append(f"cost {cost['cost']:,.4f}")
    return "cost: " + "; ".join(parts)


def _read(cost: dict) -> str:
    """Bytes read from storage (as stored), and what they decompressed to where that differs."""
    stored, decoded = cost["bytes_read"], cost.get("bytes_decoded") or 0
    return format_bytes(stored) + (f" ({format_bytes(decoded)} decoded)" if decoded and decoded != stored else "")


COMPARED = (
    ("elapsed_s", lambda st, c: st.get("elapsed_s")),
    ("items_in", lambda st, c: st.get("items_in")),
    ("items_out", lambda st, c: st.get("items_out")),
    ("cpu_s", lambda st, c: c.get("cpu_s")),
    ("task_s", lambda st, c: c.get("task_s")),
    ("peak_rss", lambda st, c: c.get("peak_rss")),
    ("bytes_read", lambda st, c: c.get("bytes_read")),
    ("bytes_written", lambda st, c: c.get("bytes_written")),
    ("shuffle_bytes_written", lambda st, c: c.get("shuffle_bytes_written")),
    ("shuffle_bytes_read", lambda st, c: c.get("shuffle_bytes_read")),
    ("retries", lambda st, c: sum((c.get("retries") or {}).values()) if c else None),
    ("cost", lambda st, c: c.get("cost")),
)
"""The figures compared per stage: (name, how to read it from a snapshot stage and its cost)."""


def compare_runs(a: dict, b: dict) -> list[dict]:
    """Per stage (matched by index), each figure of run `a` and run `b` and the ratio b/a
    (None where a figure is missing or a's is 0)."""
    stages_a = {st["index"]: st for st in a.get("stages", ())}
    stages_b = {st["index"]: st for st in b.get("stages", ())}
    rows = []
    for index in sorted(set(stages_a) | set(stages_b)):
        sa, sb = stages_a.get(index, {}), stages_b.get(index, {})
        ca, cb = sa.get("cost") or {}, sb.get("cost") or {}
        figures = []
        for name, read in COMPARED:
            va, vb = read(sa, ca) if sa else None, read(sb, cb) if sb else None
            ratio = vb / va if isinstance(va, (int, float)) and isinstance(vb, (int, float)) and va else None
            figures.append({"figure": name, "a": va, "b": vb, "ratio": ratio})
        rows.append({"index": index, "description_a": sa.get("description"), "description_b": sb.get("description"),
                     "figures": figures})
    return rows


def format_comparison(a: dict, b: dict, name_a: str = "A", name_b: str = "B") -> str:
    """Two runs' stages side by side, each figure with the ratio B/A."""
    lines = [f"A: {name_a} (run {a.get('run_id')}, {a.get('state')}, {a.get('backend')})",
             f"B: {name_b} (run {b.get('run_id')}, {b.get('state')}, {b.get('backend')})"]
    for row in compare_runs(a, b):
        same = row["description_a"] == row["description_b"]
        lines.append(f"stage {row['index']}: {row['description_a'] or '(not in A)'}"
                     + ("" if same else f"  |  B: {row['description_b'] or '(not in B)'}"))
        lines.append(f"  {'figure':<22} {'A':>14} {'B':>14} {'B/A':>8}")
        for f in row["figures"]:
            ratio = "-" if f["ratio"] is None else f"{f['ratio']:.2f}x"
            lines.append(f"  {f['figure']:<22} {_value(f['figure'], f['a']):>14} {_value(f['figure'], f['b']):>14} {ratio:>8}")
    return "\n".join(lines)


def _value(name: str, value) -> str:
    if value is None:
        return "-"
    if name in ("peak_rss",) or "bytes" in name:
        return format_bytes(value)
    if name.endswith("_s"):
        return f"{value:,.2f}s"
    if name == "cost":
        return f"{value:,.4f}"
    return f"{value:,}"
