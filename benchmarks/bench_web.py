"""Web pages to filtered text: zephyr with marin.web against datatrove and a hand-written loop (issue 40).

    uv run --group bench python benchmarks/bench_web.py --json benchmarks/results/web.json

The fixed benchmark set (`marin.web.debian_docs.find_pages(per_manual=150)`: 465 real pages)
wrapped into 4 WARC files. Two measurements, on the same files and cores:

- **per step** (one process, one core, CPU seconds): reading the WARC files, extracting the main
  text, identifying the language, the quality rules, each done by marin.web's pipeline step,
  by the bare library call the hand-written loop makes, and by datatrove's block, on the same
  inputs (extraction: the same HTML; language: the same text; rules: the same English texts;
  datatrove's Trafilatura block only end to end: section 18 measured it per page);
- **end to end** (one child process per run, `--cores` workers, the variants alternating over
  `--rounds`): WARC -> text -> English (score >= 0.65) -> Gopher, C4, FineWeb rules -> JSON Lines,
  by zephyr on a warm local Ray and on a threadpool, the hand-written loop (a process pool),
  datatrove with Trafilatura (its published pipeline) and with resiliparse. CPU is the whole
  process tree's (Ray's daemons included); peak RSS the largest process's (sampled VmHWM). What each kept is
  compared: kept by both, and the share of pages on which the two decide alike.

The machine is shared: wall times move with its load; CPU seconds are the figure to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from machine import load_average, machine, work_dir  # noqa: E402

E2E = ("zephyr-ray", "hand", "datatrove-resiliparse", "datatrove-trafilatura", "zephyr-threadpool")


def _documents(texts: list[str]):
    from datatrove.data import Document

    return [Document(text=t, id=str(i)) for i, t in enumerate(texts)]


def step_inputs(warcs: list[str]) -> dict:
    """Every step's input, made once by marin.web: records, extracted texts, English texts."""
    from marin.web import HtmlExtractor, LanguageIdentifier
    from zephyr.io.warc import read_warc

    records = [r for path in warcs for r in read_warc(path)]
    texts = [d["text"] for r in records for d in HtmlExtractor()(r)]
    english = [d["text"] for t in texts for d in LanguageIdentifier(("en",), 0.65)({"text": t})]
    return {"records": records, "html": [r["content"].decode("utf-8") for r in records], "texts": texts, "english": english}


def _fastwarc_read(paths: list[str]) -> list:
    from fastwarc.warc import ArchiveIterator, WarcRecordType

    out = []
    for path in paths:
        with open(path, "rb") as f:
            out += [(r.headers.get("WARC-Target-URI"), r.reader.read())
                    for r in ArchiveIterator(f, record_types=WarcRecordType.response, parse_http=True)]
    return out


def _datatrove_chain(steps: list, docs: list) -> list:
    for step in steps:
        docs = step.run(docs)
    return list(docs)


def step_variants(warcs: list[str], inputs: dict) -> dict:
    """(step, implementation) -> a function of nothing that does that step over its inputs, by
    marin.web's pipeline step and by the bare library call the hand-written loop makes."""
    from resiliparse.extract.html2text import extract_plain_text

    from marin.web import HtmlExtractor, LanguageIdentifier, QualityFilter
    from marin.web.extract import decode_html
    from marin.web.langid import language_model
    from marin.web.quality import first_broken_rule
    from zephyr.io.warc import read_warc

    rules, model, extract = QualityFilter(), language_model(), HtmlExtractor()
    language = LanguageIdentifier(("en",), 0.65)
    texts, english = [{"text": t} for t in inputs["texts"]], [{"text": t} for t in inputs["english"]]
    return {
        ("read", "marin.web"): lambda: [r for p in warcs for r in read_warc(p)],
        ("read", "hand"): lambda: _fastwarc_read(warcs),
        ("extract", "marin.web"): lambda: [d for r in inputs["records"] for d in extract(r)],
        ("extract", "hand"): lambda: [extract_plain_text(decode_html(r["content"], r["charset"])[0], main_content=True, alt_texts=False)
                                      for r in inputs["records"]],
        ("language", "marin.web"): lambda: [d for r in texts for d in language(r)],
        ("language", "hand"): lambda: [model.predict(r["text"].replace("\n", " "), k=1) for r in texts],
        ("quality", "marin.web"): lambda: [d for r in english for d in rules(r)],
        ("quality", "hand"): lambda: [first_broken_rule(r["text"], rules) for r in english],
    }


def datatrove_step_variants(warc_dir: str, inputs: dict) -> dict:
    """The same steps by datatrove's blocks (warmed: models loaded, tokenizers built)."""
    import web_peers
    from datatrove.pipeline.readers import WarcReader

    web_peers.quiet_datatrove()
    language_filter, filters = web_peers.bundled_language_filter(), web_peers.datatrove_filters()
    resiliparse = web_peers.resiliparse_extractor()  # Trafilatura per page: section 18 (187 ms), here end to end only
    for block in (language_filter, *filters):
        _datatrove_chain([block], _documents([inputs["english"][0]]))
    return {
        ("read", "datatrove"): lambda: list(WarcReader(warc_dir, glob_pattern="*.warc.gz").run()),
        ("extract", "datatrove (resiliparse)"): lambda: _datatrove_chain([resiliparse], _documents(inputs["html"])),
        ("language", "datatrove"): lambda: _datatrove_chain([language_filter], _documents(inputs["texts"])),
        ("quality", "datatrove"): lambda: _datatrove_chain(filters, _documents(inputs["english"])),
    }


def measure_steps(warcs: list[str], warc_dir: str, rounds: int, datatrove: bool) -> list[dict]:
    """CPU seconds of each (step, implementation), this process's and its children's (datatrove
    extracts in a sandbox process); each round runs a step's implementations in a rotated order.
    datatrove's rules take minutes a round: they run in the first only."""
    from web_peers import tree_cpu

    inputs = step_inputs(warcs)
    variants = {**step_variants(warcs, inputs), **(datatrove_step_variants(warc_dir, inputs) if datatrove else {})}
    sizes = {"read": len(inputs["records"]), "extract": len(inputs["records"]), "language": len(inputs["texts"]),
             "quality": len(inputs["english"])}
    cpu: dict[tuple, list[float]] = {key: [] for key in variants}
    for r in range(rounds):
        for step in sizes:
            impls = [key for key in variants if key[0] == step]
            for key in impls[r % len(impls):] + impls[:r % len(impls)]:
                if r > 0 and key == ("quality", "datatrove"):
                    continue
                start = tree_cpu()
                variants[key]()
                cpu[key].append(tree_cpu() - start)
                print(f"  step {key[0]:<9} {key[1]:<26} {cpu[key][-1]:7.2f} CPU s", flush=True)
    rows = []
    for (step, impl), values in cpu.items():
        best = min(values)
        rows.append({"step": step, "implementation": impl, "pages": sizes[step], "cpu_s": [round(v, 3) for v in values],
                     "ms_per_page": round(1000 * best / sizes[step], 2), "pages_per_cpu_s": round(sizes[step] / best, 1)})
    return rows


def run_child(spec: dict) -> dict:
    """One end-to-end variant in a fresh Python process; its measurements as a dict."""
    env = dict(os.environ, RAY_ENABLE_UV_RUN_RUNTIME_ENV="0", RAY_USAGE_STATS_ENABLED="0")
    proc = subprocess.run([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], capture_output=True, text=True,
                          env=env, timeout=3600, check=False)
    if proc.returncode != 0:
        raise RuntimeError(f"{spec['variant']} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def measure_end_to_end(warcs: list[str], warc_dir: str, work: str, cores: int, rounds: int, variants: tuple[str, ...]) -> dict:
    runs: dict[str, list[dict]] = {v: [] for v in variants}
    for r in range(rounds):
        for variant in variants:
            out = os.path.join(work, "out", f"{variant}-{r}")
            spec = {"variant": variant, "out": out, "cores": cores, "warcs": warcs, "warc_dir": warc_dir,
                    "logs": os.path.join(work, "logs", f"{variant}-{r}")}
            try:
                result = run_child(spec)
            except RuntimeError as e:  # a loaded machine: Ray's node may time out starting; once more, said
                print(f"  e2e {variant} round {r} failed, run again: {str(e).splitlines()[-1]}", flush=True)
                result = run_child(spec)
            runs[variant].append(result)
            print(f"  e2e {variant:<22} round {r}: {result['seconds']:6.1f} s  {result['cpu_s']:6.1f} CPU s  "
                  f"{result['peak_rss_mib']:6.0f} MiB  kept {len(result['kept'])}  (load {load_average()})", flush=True)
    return runs


def agreement(kept: dict[str, set], pages: int, reference: str) -> dict:
    """Per variant: how many it kept, how many of those `reference` (zephyr) kept too, and the
    share of pages on which the two decided alike (both kept or both dropped)."""
    ours = kept[reference]
    return {v: {"kept": len(k), "kept_by_both": len(k & ours), "agree": round(1 - len(k ^ ours) / pages, 4)} for v, k in kept.items()}


def summarize(runs: dict, pages: int) -> list[dict]:
    rows = []
    for variant, results in runs.items():
        cpu = [r["cpu_s"] for r in results]
        rows.append({"variant": variant, "seconds_median": round(statistics.median(r["seconds"] for r in results), 2),
                     "cpu_s": [round(c, 2) for c in cpu], "cpu_ms_per_page": round(1000 * min(cpu) / pages, 1),
                     "pages_per_cpu_s": round(pages / min(cpu), 1), "peak_rss_mib": round(max(r["peak_rss_mib"] for r in results))})
    return rows


def print_tables(steps: list[dict], e2e: list[dict], agree: dict, pages: int) -> None:
    print("\n| step | implementation | CPU ms/page (best) | pages per CPU s |\n| --- | --- | --- | --- |")
    for row in steps:
        print(f"| {row['step']} | {row['implementation']} | {row['ms_per_page']} | {row['pages_per_cpu_s']} |")
    hand = next((r for r in e2e if r["variant"] == "hand"), None)
    print(f"\n| end to end ({pages} pages) | wall s (median) | CPU s (each run) | CPU ms/page (best) | vs hand loop (CPU) | "
          "peak RSS (largest process) | kept | kept by both | agree with zephyr |\n| --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    for row in e2e:
        ratio = f"{min(row['cpu_s']) / min(hand['cpu_s']):.2f}x" if hand else "-"
        a = agree[row["variant"]]
        print(f"| {row['variant']} | {row['seconds_median']} | {', '.join(map(str, row['cpu_s']))} | {row['cpu_ms_per_page']} | {ratio} | "
              f"{row['peak_rss_mib']} MiB | {a['kept']} | {a['kept_by_both']} | {a['agree']:.1%} |")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--work-dir", help="where the WARC files and outputs go (default: a temporary directory)")
    p.add_argument("--json", help="write the figures here")
    p.add_argument("--per-manual", type=int, default=150, help="pages of the Python and C++ manuals (default 150: the fixed set)")
    p.add_argument("--cores", type=int, default=2)
    p.add_argument("--rounds", type=int, default=2, help="end-to-end rounds, the variants alternating in each")
    p.add_argument("--step-rounds", type=int, default=2, help="per-step rounds (datatrove's rules: once)")
    p.add_argument("--no-datatrove", dest="datatrove", action="store_false",
                   help="leave datatrove out (it needs the bench group: warcio, faust-cchardet, python-magic, fasteners)")
    p.add_argument("--variants", default=",".join(E2E), help=f"end-to-end variants (default all: {','.join(E2E)})")
    p.add_argument("--child", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        import web_peers

        print(json.dumps(web_peers.run_variant(json.loads(args.child))))
        return
    from marin.web.debian_docs import find_pages, missing_packages
    from marin.web.sample_warc import write_sample_warcs

    if missing := missing_packages():
        p.error(f"Debian documentation packages missing: {' '.join(missing)}")
    with work_dir(args.work_dir, "bench-web-") as work:
        pages = find_pages(args.per_manual)
        warc_dir = os.path.join(work, "warc")
        warcs = write_sample_warcs(warc_dir, pages, 4)
        print(f"{len(pages)} pages in {len(warcs)} WARC files; machine {machine()}; load {load_average()}", flush=True)
        steps = measure_steps(warcs, warc_dir, args.step_rounds, args.datatrove)
        variants = tuple(v for v in args.variants.split(",") if args.datatrove or not v.startswith("datatrove"))
        runs = measure_end_to_end(warcs, warc_dir, work, args.cores, args.rounds, variants)
        kept = {v: set(results[0]["kept"]) for v, results in runs.items()}
        unstable = [v for v, results in runs.items() if any(set(r["kept"]) != kept[v] for r in results)]
        agree = agreement(kept, len(pages), next(iter(kept)))  # against the first variant, zephyr's
        e2e = summarize(runs, len(pages))
        print_tables(steps, e2e, agree, len(pages))
        if unstable:
            print(f"\nkept different pages from one round to the next: {unstable}")
        if args.json:
            with open(args.json, "w") as f:
                json.dump({"machine": machine(), "pages": len(pages), "cores": args.cores, "steps": steps, "end_to_end": e2e,
                           "agreement": agree, "unstable": unstable, "load_after": load_average()}, f, indent=2)


if __name__ == "__main__":
    main()
