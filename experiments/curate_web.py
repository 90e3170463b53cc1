"""Curate a web crawl: WARC files in, clean deduplicated training text and tokens out, with a summary.

    uv run python -m marin.web.sample_warc /tmp/warc --duplicates --bad-pages   # real pages as WARC
    uv run python experiments/curate_web.py --input '/tmp/warc/*.warc.gz' --output /tmp/curated

Six executor steps under `--output DIR` (the executor's prefix), each a Zephyr pipeline on the
flow backend (an embedded local Ray unless `RAY_ADDRESS` is set; `--backend threadpool` runs in
this process):

1. `curate_web/documents`   WARC -> main text (resiliparse) -> language and score (fastText
                            lid.176), every readable page kept and labelled;
2. `curate_web/classifier`  with `--classifier-train GLOB` only: a fastText quality model
                            trained from labelled JSON Lines (`text`, `label`);
3. `curate_web/filtered`    the `--languages` asked for (score >= `--min-language-score`), then
                            Gopher, C4 and FineWeb's rules, then the classifier (if any);
4. `DIR/clean`              exact dedup (text digest), then near dedup (MinHash LSH):
                            `part-NNNNN.jsonl.zst` records with url, text, language,
                            language_score (and quality_score with a classifier);
5. `curate_web/tokens`      a token cache of the clean text (`--tokenizer`);
6. `DIR/summary`            documents in/out of each step, drops per rule, CPU per page and
                            throughput: printed, and written as summary.json and summary.png.

Steps 1-3 and 5 live under `<name>-<hash>` paths, so a rerun skips what is done and changing an
option reruns only the steps it affects. `clean` and `summary` have fixed paths: a run whose
options would change them stops and says so, rather than keep or overwrite them. Unreadable WARC
records, binary payloads, broken encodings and huge pages are dropped and counted, never fatal.
"""

from __future__ import annotations

import argparse
import io
import os
import sys

import fsspec
import orjson

from marin.execution import ExecutorStep, executor_main, output_path_of, this_output_path, versioned
from marin.execution.main import ExecutorMainConfig
from marin.web.curate import (
    ClassifierConfig, CleanConfig, DocumentsConfig, FilterConfig, TokensConfig, clean, extract_documents, files_digest,
    filter_documents, tokenize_clean, train_classifier,
)
from marin.web.curate_summary import SUMMARY_FILE, SummaryConfig, build_summary, format_summary, read_summary
from marin.web.extract import EXTRACTORS

CLEAN_DIR, SUMMARY_DIR = "clean", "summary"
PLOT_FILE = "summary.png"


def write_summary(config: SummaryConfig) -> None:
    """The summary step: `summary.json` and `summary.png`."""
    summary = build_summary(config)
    with fsspec.open(f"{config.output_path}/{SUMMARY_FILE}", "wb") as f:
        f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    plot_summary(summary, f"{config.output_path}/{PLOT_FILE}")


def plot_summary(summary: dict, path: str) -> None:
    """Documents out of each step, the 15 largest drop reasons, and CPU ms per page by step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = summary["steps"]
    fig, (funnel, drops, cost) = plt.subplots(1, 3, figsize=(16, 4.5))
    funnel.bar([r["step"] for r in rows], [r["out"] for r in rows], color="#27a")
    funnel.set_title(f"documents out of each step ({rows[0]['in']:,} records in)")
    funnel.tick_params(axis="x", rotation=45)
    reasons = sorted(((f"{r['step']}: {k}", v) for r in rows for k, v in r["dropped"].items() if v), key=lambda kv: kv[1])[-15:]
    drops.barh([k for k, _ in reasons], [v for _, v in reasons], color="#a52")
    drops.set_title("documents dropped, by reason")
    timed = [r for r in rows if r["ms_per_page"] is not None]
    cost.bar([r["step"] for r in timed], [r["ms_per_page"] for r in timed], color="#4a7")
    cost.set_title("CPU ms per page into the step")
    cost.tick_params(axis="x", rotation=45)
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    with fsspec.open(path, "wb") as f:
        f.write(buffer.getvalue())


def page_steps(args: argparse.Namespace) -> tuple[ExecutorStep, ExecutorStep | None, ExecutorStep]:
    """The per-page steps: documents, the classifier (None without --classifier-train), filtered."""
    documents = ExecutorStep(
        name="curate_web/documents",
        fn=extract_documents,
        config=DocumentsConfig(versioned(args.input), this_output_path(), versioned(files_digest(args.input)), versioned(args.extractor)),
        description="WARC -> main text -> language, every readable page.",
    )
    classifier = None
    if args.classifier_train:
        classifier = ExecutorStep(
            name="curate_web/classifier",
            fn=train_classifier,
            config=ClassifierConfig(versioned(args.classifier_train), this_output_path(), versioned(files_digest(args.classifier_train))),
            description="A fastText quality classifier trained from labelled JSON Lines.",
        )
    filtered = ExecutorStep(
        name="curate_web/filtered",
        fn=filter_documents,
        config=FilterConfig(
            output_path_of(documents), this_output_path(), versioned(args.languages), versioned(args.min_language_score),
            output_path_of(classifier) if classifier else None, versioned(args.classifier_threshold), versioned(args.classifier_label),
        ),
        description="Languages, Gopher/C4/FineWeb rules, the classifier.",
    )
    return documents, classifier, filtered


def build_steps(args: argparse.Namespace) -> list[ExecutorStep]:
    documents, classifier, filtered = page_steps(args)
    cleaned = ExecutorStep(
        name="curate_web/clean",
        fn=clean,
        config=CleanConfig(output_path_of(filtered), this_output_path(), versioned(args.near_threshold)),
        description="Exact then near dedup.",
        override_output_path=CLEAN_DIR,
    )
    tokens = ExecutorStep(
        name="curate_web/tokens",
        fn=tokenize_clean,
        config=TokensConfig(output_path_of(cleaned), this_output_path(), versioned(args.tokenizer), versioned(args.eod_token)),
        description="A token cache of the clean text.",
    )
    summary = ExecutorStep(
        name="curate_web/summary",
        fn=write_summary,
        config=SummaryConfig(args.input, output_path_of(documents), output_path_of(filtered), output_path_of(cleaned),
                             output_path_of(tokens), this_output_path(), output_path_of(classifier) if classifier else None),
        description="Documents per step, drops per rule, throughput.",
        override_output_path=SUMMARY_DIR,
    )
    return [step for step in (documents, classifier, filtered, cleaned, tokens, summary) if step is not None]


def refuse_other_versions(prefix: str, steps: list[ExecutorStep]) -> None:
    """Stop when a fixed-path step (clean, summary) holds the output of other options: the
    executor would keep it as done, and the user asked for these."""
    from marin.execution import Executor
    from marin.execution.status import read_info

    for planned in Executor(prefix).plan(steps).steps:
        recorded = (read_info(planned.output_path) or {}).get("hash") if planned.step.override_output_path else None
        if recorded is not None and recorded != planned.hash:
            raise SystemExit(
                f"curate_web: {planned.output_path} holds the output of other options (step hash {recorded}, these options "
                f"give {planned.hash}). Remove {prefix}/{CLEAN_DIR} and {prefix}/{SUMMARY_DIR}, or pass another --output."
            )


def start_backend(name: str, max_parallelism: int | None) -> None:
    """Install the flow backend: an embedded local Ray (or RAY_ADDRESS's cluster), or a threadpool here."""
    from zephyr import create_backend, set_flow_backend

    if name == "ray":
        import ray

        from zephyr.backends.ray_local import start_local_ray

        if not ray.is_initialized():
            if os.environ.get("RAY_ADDRESS"):
                ray.init()
            else:
                print(f"curate_web: {start_local_ray(log_to_driver=False)}", flush=True)
    set_flow_backend(create_backend(name, max_parallelism=max_parallelism, memory="1GiB"))


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0], epilog=__doc__.split("\n\n", 1)[1],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--input", required=True, help="WARC (or WET) files: a glob, local or any fsspec URL ('crawl/*.warc.gz')")
    parser.add_argument("--output", required=True, help="where every step's output goes (the executor's prefix)")
    parser.add_argument("--languages", default="en",
                        help="comma-separated languages to keep (ISO 639-1), or 'all' (default en: the quality rules are English rules)")
    parser.add_argument("--min-language-score", type=float, default=0.65, help="lowest language score kept (default 0.65, FineWeb's)")
    parser.add_argument("--extractor", choices=EXTRACTORS, default="resiliparse", help="main-text extractor (default resiliparse)")
    parser.add_argument("--classifier-train", help="labelled JSON Lines ({text, label}) to train a quality classifier on; "
                        "without it the classifier step is skipped (the summary says so)")
    parser.add_argument("--classifier-label", default="hq", help="the label whose probability is the quality score (default hq)")
    parser.add_argument("--classifier-threshold", type=float, default=0.5, help="lowest quality score kept (default 0.5)")
    parser.add_argument("--near-threshold", type=float, default=0.8, help="Jaccard similarity of near duplicates (default 0.8)")
    parser.add_argument("--tokenizer", default="byte", help="'byte' or a tokenizer.json (local or gs://) (default byte)")
    parser.add_argument("--eod-token", help="the tokenizer's end-of-document token (default: byte 256 for 'byte')")
    parser.add_argument("--backend", choices=("ray", "threadpool"), default="ray",
                        help="ray: an embedded local Ray, or RAY_ADDRESS's cluster (default); threadpool: threads of this process")
    parser.add_argument("--max-parallelism", type=int, help="shards at once (default: the backend's, the CPUs)")
    parser.add_argument("--dry-run", action="store_true", help="say what each step would do; run nothing")
    parser.add_argument("--force-run-failed", action="store_true", help="rerun steps that failed before")
    args = parser.parse_args(argv)
    args.languages = None if args.languages == "all" else tuple(sorted({x.strip() for x in args.languages.split(",") if x.strip()}))
    for name in ("min_language_score", "classifier_threshold"):
        if not 0.0 <= getattr(args, name) <= 1.0:
            parser.error(f"--{name.replace('_', '-')} must be within [0, 1], got {getattr(args, name)}")
    return args


def main(argv: list[str] | None = None) -> dict[str, str]:
    args = parse_args(argv)
    try:
        steps = build_steps(args)
    except FileNotFoundError as e:
        raise SystemExit(f"curate_web: {e}") from None
    prefix = args.output.rstrip("/") if "://" in args.output else os.path.abspath(args.output)
    config = ExecutorMainConfig(prefix=prefix, dry_run=args.dry_run, force_run_failed=args.force_run_failed)
    refuse_other_versions(prefix, steps)
    from marin.execution import Executor

    pending = Executor(prefix).dry_run(steps, out=lambda line: None)
    if not args.dry_run and any(action != "skip" for action in pending.values()):
        start_backend(args.backend, args.max_parallelism)  # only when a step will run: a finished run reprints in seconds
    outcome = executor_main(steps, description="Curate a web crawl: WARC -> text -> filters -> dedup -> tokens.", config=config)
    summary_dir = f"{prefix}/{SUMMARY_DIR}"
    if outcome.get(summary_dir) in ("SUCCESS", "SKIPPED"):
        print(format_summary(read_summary(summary_dir)))
        print(f"  written     {prefix}/{CLEAN_DIR}/*.jsonl.zst, {summary_dir}/{SUMMARY_FILE} and {PLOT_FILE}")
    return outcome


if __name__ == "__main__":
    main(sys.argv[1:])
