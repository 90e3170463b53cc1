"""The worked web curation run's steps, as executor step functions (`experiments/curate_web.py`
wires them into a DAG; `marin.web.curate_summary` reports on them):

    documents   WARC -> main text -> language (every page labelled, none dropped)
    classifier  a fastText quality model trained from labelled JSON Lines (optional)
    filtered    the languages asked for -> Gopher, C4, FineWeb rules -> the classifier
    clean       exact dedup (text digest) -> near dedup (MinHash LSH)
    tokens      a token cache of the clean text

Each zephyr step runs on the flow backend (`zephyr.flow_backend()`), writes
`part-NNNNN.jsonl.zst` (skip_existing: a rerun after a crash keeps finished shards) and
`stats.json` beside them: the run's counters, its wall and CPU seconds, and whether the counters
cover every shard (`counters_complete`: not when the run kept shards an earlier one wrote; the
summary says so). Every per-page step is
wrapped in `TimedStep`, which counts its thread CPU under `web/cpu_us/<step>`, so the summary
can give each step's cost per page though zephyr fuses them into one stage. Bad pages never stop
a run: unreadable WARC records are skipped and counted (`zephyr/bad_records`), and each step
drops and counts what it cannot use (see `marin.web.extract`).
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Callable
from dataclasses import dataclass

import fsspec
import orjson

from marin.web.classifier import QualityClassifier, model_bytes, train_quality_classifier
from marin.web.extract import HtmlExtractor
from marin.web.langid import LanguageFilter, LanguageIdentifier
from marin.web.quality import QualityFilter
from zephyr import Dataset, counters, flow_backend
from zephyr.io import expand_glob

__all__ = [
    "ClassifierConfig", "CleanConfig", "DocumentsConfig", "FilterConfig", "MODEL_FILE", "STATS_FILE", "TimedStep",
    "TokensConfig", "clean", "extract_documents", "files_digest", "filter_documents", "read_stats", "tokenize_clean",
    "train_classifier",
]

STATS_FILE = "stats.json"
MODEL_FILE = "model.bin"


@dataclass(frozen=True)
class TimedStep:
    """A `flat_map` step that also counts the CPU it spends, in microseconds of its thread,
    under `web/cpu_us/<name>` (two clock reads a page: well under 1% of any step here)."""

    name: str
    step: Callable[[dict], list[dict]]

    def __call__(self, record: dict) -> list[dict]:
        start = time.thread_time_ns()
        try:
            return self.step(record)
        finally:
            counters.increment(f"web/cpu_us/{self.name}", (time.thread_time_ns() - start) // 1000)


def _count(name: str) -> Callable[[dict], dict]:
    def count(record: dict) -> dict:
        counters.increment(name)
        return record

    count.__qualname__ = f"count[{name}]"
    return count


def files_digest(pattern: str) -> str:
    """A digest of the files `pattern` matches (their paths and sizes): versioned in the
    experiment, so the step reruns when files are added, removed or rewritten to another size.

    Raises FileNotFoundError when nothing matches."""
    paths = expand_glob(pattern)
    if not paths:
        raise FileNotFoundError(f"no files match {pattern!r}")
    fs = fsspec.core.url_to_fs(paths[0])[0]
    listing = "".join(f"{path}\t{fs.size(path)}\n" for path in sorted(paths))
    return hashlib.sha256(listing.encode()).hexdigest()[:16]


# what a run does instead of running a shard: that shard's counters are not in this run's
_RESUMED = ("zephyr/shards_skipped_existing", "zephyr/stages_skipped_outputs_exist", "zephyr/map_shards_resumed")


def _run_and_record(pipeline: Dataset, output_path: str) -> list:
    """Run `pipeline` on the flow backend, write its `stats.json` (see the module) and return
    its results."""
    start = time.perf_counter()
    execution = flow_backend().execute(pipeline)
    results = list(execution)
    totals = dict(sorted(execution.counters.items()))
    stats = {
        "seconds": round(time.perf_counter() - start, 3),
        "cpu_s": round(sum(s.cost.cpu_s for s in execution.stats), 3),
        "counters_complete": not any(totals.get(name) for name in _RESUMED),
        "counters": totals,
    }
    with fsspec.open(f"{output_path}/{STATS_FILE}", "wb") as f:
        f.write(orjson.dumps(stats, option=orjson.OPT_INDENT_2))
    return results


def read_stats(path: str) -> dict:
    """The `stats.json` a step wrote under `path`."""
    with fsspec.open(f"{path}/{STATS_FILE}", "rb") as f:
        return orjson.loads(f.read())


def _output(path: str) -> str:
    return f"{path}/part-{{shard:05d}}.jsonl.zst"


# ---- documents: WARC -> text -> language ----------------------------------------------------


@dataclass(frozen=True)
class DocumentsConfig:
    input_glob: str
    output_path: str
    input_digest: str = ""  # files_digest(input_glob), versioned by the experiment
    extractor: str = "resiliparse"


def extract_documents(config: DocumentsConfig) -> None:
    """Every readable page's main text with its language and score; nothing dropped for its language."""
    pipeline = (
        Dataset.from_files(config.input_glob)
        .load_warc(on_bad_record="skip")
        .map(_count("web/records_read"))
        .flat_map(TimedStep("extract", HtmlExtractor(config.extractor)))
        .flat_map(TimedStep("language", LanguageIdentifier()))
        .write_jsonl(_output(config.output_path), skip_existing=True)
    )
    _run_and_record(pipeline, config.output_path)


# ---- classifier: train from labelled JSON Lines ---------------------------------------------


@dataclass(frozen=True)
class ClassifierConfig:
    train_glob: str
    output_path: str
    train_digest: str = ""  # files_digest(train_glob), versioned by the experiment


def train_classifier(config: ClassifierConfig) -> None:
    """`output_path/model.bin`, trained from `train_glob` (`text` and `label` fields)."""
    start = time.perf_counter()
    train_quality_classifier(config.train_glob, f"{config.output_path}/{MODEL_FILE}")
    with fsspec.open(f"{config.output_path}/{STATS_FILE}", "wb") as f:
        f.write(orjson.dumps({"seconds": round(time.perf_counter() - start, 3), "train_glob": config.train_glob}))


# ---- filtered: languages, heuristics, classifier ----------------------------------------------


@dataclass(frozen=True)
class FilterConfig:
    documents: str
    output_path: str
    languages: tuple[str, ...] | None = ("en",)  # None: every language
    min_language_score: float = 0.65  # FineWeb's
    classifier: str | None = None  # a classifier step's output path; None: no classifier step
    classifier_threshold: float = 0.5
    classifier_label: str = "hq"


def filter_documents(config: FilterConfig) -> None:
    """The documents in the languages asked for that pass the quality rules and the classifier."""
    pipeline = (
        Dataset.from_files(f"{config.documents}/*.jsonl.zst")
        .load_jsonl()
        .map(_count("web/filter_in"))
        .flat_map(TimedStep("language_filter", LanguageFilter(config.languages, config.min_language_score)))
        .flat_map(TimedStep("quality", QualityFilter()))
    )
    if config.classifier is not None:
        data = model_bytes(f"{config.classifier}/{MODEL_FILE}")
        name = f"web-quality-model-{hashlib.sha256(data).hexdigest()[:16]}"
        flow_backend().put(name, data)  # shipped once; each worker loads it once
        classifier = QualityClassifier(name, config.classifier_threshold, config.classifier_label)
        pipeline = pipeline.flat_map(TimedStep("classifier", classifier))
    _run_and_record(pipeline.write_jsonl(_output(config.output_path), skip_existing=True), config.output_path)


# ---- clean: exact and near dedup ------------------------------------------------------------


@dataclass(frozen=True)
class CleanConfig:
    filtered: str
    output_path: str
    near_threshold: float = 0.8


def text_digest(record: dict) -> str:
    return hashlib.blake2b(record["text"].encode(), digest_size=16).hexdigest()


def record_text(record: dict) -> str:
    return record["text"]


def clean(config: CleanConfig) -> None:
    """One document per exact text (the first by shard and position), then one per cluster of
    near duplicates (`deduplicate_fuzzy`: word 5-gram MinHash LSH at `near_threshold`)."""
    pipeline = (
        Dataset.from_files(f"{config.filtered}/*.jsonl.zst")
        .load_jsonl()
        .map(_count("web/dedup_in"))
        .deduplicate(text_digest)
        .map(_count("web/exact_dedup_out"))
        .deduplicate_fuzzy(record_text, threshold=config.near_threshold)
        .map(_count("web/near_dedup_out"))
        .write_jsonl(_output(config.output_path), skip_existing=True)
    )
    _run_and_record(pipeline, config.output_path)


# ---- tokens ---------------------------------------------------------------------------------


@dataclass(frozen=True)
class TokensConfig:
    clean: str
    output_path: str
    tokenizer: str = "byte"  # or a tokenizer.json (then eod_token names its end-of-document token)
    eod_token: str | None = None


def tokenize_clean(config: TokensConfig) -> None:
    """A token cache (`part-NNNNN.npy` + `ledger.json`) of the clean documents' text."""
    from marin.tokenize import finish_token_cache, tokenize_dataset

    records = Dataset.from_files(f"{config.clean}/*.jsonl.zst").load_jsonl()
    pipeline = tokenize_dataset(records, config.output_path, tokenizer=config.tokenizer, eod_token=config.eod_token)
    finish_token_cache(_run_and_record(pipeline, config.output_path), config.output_path)
