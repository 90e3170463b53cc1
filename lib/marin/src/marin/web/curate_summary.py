"""What a web curation run did, from the counters its steps kept (`marin.web.curate`): documents
in and out of every step, what each rule dropped, and what each step cost (`build_summary`,
which the experiment writes as `summary.json` and plots), and the console lines
(`format_summary`).

Per-page steps (extract, language, quality, classifier) are fused into one zephyr stage per
executor step; their CPU comes from `web/cpu_us/<step>` (`TimedStep`). The dedup and token
steps' CPU is their whole zephyr run's (both dedups on the exact_dedup row). When a step's run kept shards an earlier run wrote, its
counters miss those shards: `counters_complete` is false and the console says so.
"""

from __future__ import annotations

from dataclasses import dataclass

import fsspec
import orjson

from marin.web.curate import read_stats

__all__ = ["SUMMARY_FILE", "SummaryConfig", "build_summary", "format_summary", "read_summary"]

SUMMARY_FILE = "summary.json"


@dataclass(frozen=True)
class SummaryConfig:
    input_glob: str
    documents: str
    filtered: str
    clean: str
    tokens: str
    output_path: str
    classifier: str | None = None  # the classifier step's output path, None when there was none


def _under(counters: dict, prefix: str, skip: tuple[str, ...] = ()) -> dict[str, int]:
    return {k.removeprefix(prefix): v for k, v in counters.items() if k.startswith(prefix) and k.removeprefix(prefix) not in skip}


def _row(step: str, n_in: int, n_out: int, dropped: dict, cpu_s: float | None, **extra) -> dict:
    row = {"step": step, "in": n_in, "out": n_out, "dropped": dropped, "cpu_s": None if cpu_s is None else round(cpu_s, 3),
           "ms_per_page": round(1000 * cpu_s / n_in, 2) if cpu_s is not None and n_in else None}
    return {**row, **extra}


def _page_rows(d: dict, f: dict, classifier: bool) -> list[dict]:
    """Read, extract, language, quality and classifier, from the documents and filtered steps' counters."""
    cpu = {k: v / 1e6 for k, v in {**_under(d, "web/cpu_us/"), **_under(f, "web/cpu_us/")}.items()}
    read = d.get("web/records_read", 0)
    rows = [_row("read", read + d.get("zephyr/bad_records", 0), read, {"bad_records": d.get("zephyr/bad_records", 0)}, None)]
    extracted = d.get("web/extract/kept", 0)
    rows.append(_row("extract", d.get("web/extract/pages", 0), extracted, _under(d, "web/extract/", ("pages", "kept", "decode_replaced")),
                     cpu.get("extract"), decode_replaced=d.get("web/extract/decode_replaced", 0)))
    language_drops = {**_under(f, "web/language/dropped/"), "low_score": f.get("web/language/low_score", 0)}
    language_in = f.get("web/filter_in", 0)
    language_out = language_in - sum(language_drops.values())
    rows.append(_row("language", language_in, language_out, language_drops, cpu.get("language", 0) + cpu.get("language_filter", 0),
                     seen=_under(d, "web/language/seen/")))
    quality_out = f.get("web/quality/kept", 0)
    rows.append(_row("quality", language_out, quality_out, _under(f, "web/quality/drop/"), cpu.get("quality"),
                     c4_lines_removed=_under(f, "web/quality/c4_lines_removed/")))
    if classifier:
        rows.append(_row("classifier", quality_out, f.get("web/classifier/kept", 0),
                         {"below_threshold": f.get("web/classifier/dropped", 0)}, cpu.get("classifier")))
    else:
        rows.append(_row("classifier", quality_out, quality_out, {}, None,
                         skipped="no classifier given (--classifier-train LABELLED.jsonl trains one)"))
    return rows


def build_summary(config: SummaryConfig) -> dict:
    stats = {"documents": read_stats(config.documents), "filtered": read_stats(config.filtered),
             "clean": read_stats(config.clean), "tokens": read_stats(config.tokens)}
    if config.classifier:
        stats["classifier"] = read_stats(config.classifier)
    d, f, c, t = (stats[k]["counters"] for k in ("documents", "filtered", "clean", "tokens"))
    rows = _page_rows(d, f, config.classifier is not None)
    exact = c.get("web/exact_dedup_out", 0)
    # the clean step's CPU (both dedups, one zephyr run) on the row of the documents entering it
    rows.append(_row("exact_dedup", c.get("web/dedup_in", 0), exact, {"duplicates": c.get("web/dedup_in", 0) - exact},
                     stats["clean"]["cpu_s"]))
    rows.append(_row("near_dedup", exact, c.get("web/near_dedup_out", 0), {"near_duplicates": exact - c.get("web/near_dedup_out", 0)},
                     None))
    documents = t.get("tokenize/documents", 0)
    rows.append(_row("tokens", documents, documents, {}, stats["tokens"]["cpu_s"], tokens=t.get("tokenize/tokens", 0)))
    seconds = sum(s["seconds"] for s in stats.values())
    cpu_s = sum(s.get("cpu_s", 0.0) for s in stats.values())
    pages = rows[0]["in"]
    return {
        "input": config.input_glob,
        "clean": config.clean,
        "steps": rows,
        "executor_steps": {name: {"seconds": s["seconds"], "cpu_s": s.get("cpu_s")} for name, s in stats.items()},
        "throughput": {"pages": pages, "seconds": round(seconds, 3), "cpu_s": round(cpu_s, 3),
                       "pages_per_second": round(pages / seconds, 2) if seconds else None,
                       "cpu_ms_per_page": round(1000 * cpu_s / pages, 2) if pages else None},
        "counters_complete": all(s.get("counters_complete", True) for s in stats.values()),
    }


def read_summary(path: str) -> dict:
    with fsspec.open(f"{path}/{SUMMARY_FILE}", "rb") as f:
        return orjson.loads(f.read())


def _drops(row: dict) -> str:
    if row.get("skipped"):
        return f"skipped: {row['skipped']}"
    if row["step"] == "tokens":
        return f"{row['tokens']:,} tokens"
    shown = sorted(((k, v) for k, v in row["dropped"].items() if v), key=lambda kv: -kv[1])
    text = ", ".join(f"{k} {v:,}" for k, v in shown) or "-"
    if row.get("decode_replaced"):
        text += f" (kept with bytes replaced: {row['decode_replaced']:,})"
    return text


def format_summary(summary: dict) -> str:
    """The console lines: one per step (in, out, what was dropped and why, CPU per page), then throughput."""
    lines = ["curate_web summary", f"  {'step':<12}{'in':>8}{'out':>8}  {'ms/page':>8}  dropped"]
    for row in summary["steps"]:
        ms = f"{row['ms_per_page']:.1f}" if row["ms_per_page"] is not None else "-"
        lines.append(f"  {row['step']:<12}{row['in']:>8,}{row['out']:>8,}  {ms:>8}  {_drops(row)}")
    t = summary["throughput"]
    lines.append(f"  throughput  {t['pages']:,} pages in {t['seconds']:.1f} s ({t['pages_per_second'] or 0:,.1f} pages/s), "
                 f"{t['cpu_s']:.1f} CPU s ({t['cpu_ms_per_page'] or 0:.1f} ms/page)")
    if not summary["counters_complete"]:
        lines.append("  note        a step kept shards an earlier run wrote: their documents are not in these counts")
    return "\n".join(lines)
