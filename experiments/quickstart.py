"""Quickstart: raw corpus -> clean, deduplicated text -> tokens -> a tiny trained model -> summary.

    uv run python experiments/quickstart.py                  # outputs under ./scratch/quickstart/
    uv run python experiments/quickstart.py --prefix /tmp/qs # /tmp/qs/quickstart/; or gs://bucket/dir, or MARIN_PREFIX
    uv run python experiments/quickstart.py --docs-per-shard 375 --train-steps 60   # a smaller run (the test's)

Five executor steps, each with a versioned output path, so a second run skips everything and
changing a versioned parameter (say `MIN_WORDS`) reruns only what depends on it:

1. `quickstart/raw`     a deterministic synthetic web crawl, `.jsonl.zst` shards with exact
                        duplicates, whitespace variants, near copies (a footer added) and
                        low-quality pages;
2. `quickstart/clean`   a Zephyr pipeline: normalize, quality filters (each drop is counted),
                        exact dedup by content hash, then near-duplicate removal (MinHash LSH);
3. `quickstart/tokens`  a Zephyr pipeline: byte-level tokens into a token cache (`.npy` shards
                        + `ledger.json`; each training host reads only its rows' bytes);
4. `quickstart/train`   a tiny byte-level LM trained with the TPU training-step adapter (on a
                        real slice when `RAY_ADDRESS` points at a cluster; otherwise a local
                        Ray whose node pretends to be a v4-8 host, with JAX on the CPU);
5. `quickstart/summary` documents in/out per stage (exact and near duplicates), dedup rate, throughput and the loss curve,
                        printed and written as `summary.json` and `summary.png`.

Zephyr steps run on the flow backend: an embedded local Ray unless `RAY_ADDRESS` is set.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import logging
import math
import os
import random
import re
import time
import unicodedata
from collections import Counter
from dataclasses import dataclass

import fsspec
import orjson

from marin.execution import ExecutorStep, executor_main, output_path_of, this_output_path, versioned
from marin.tokenize import finish_token_cache, tokenize_dataset
from zephyr import Dataset, counters, flow_backend

logger = logging.getLogger("quickstart")

NUM_RAW_SHARDS = 8
DOCS_PER_SHARD = 1500
TRAIN_STEPS = 300
MIN_WORDS = 20
TPU_TYPE = "v4-8"

# ---- 1. a synthetic raw corpus ------------------------------------------------------------------

WORDS = (
    "the of and to in a is that for it as was with be by on not he this are or his from at which but have an "
    "they you were her she there been one all we their has would when if more no out so said what up its about "
    "into than them can only other new some could time these two may then do first any my now such like our over "
    "man me even most made after also did many before must through back years where much your way well down "
    "should because each just those people how too little state good very make world still own see men work long "
    "get here between both life being under never day same another know while last might us great old year off "
    "come since against go came right used take three data model train token corpus filter shard cluster"
).split()


@dataclass(frozen=True)
class RawConfig:
    output_path: str
    num_shards: int = 8
    docs_per_shard: int = 1500
    seed: int = 0


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(6, 18))]
    return " ".join(words).capitalize() + "."


def _document(rng: random.Random) -> str:
    kind = rng.random()
    if kind < 0.06:  # too short
        return _sentence(rng)
    if kind < 0.10:  # mostly symbols
        return " ".join(rng.choice(["@@@", "###", "$$$", "%%%", "&&&"]) for _ in range(60)) + " " + _sentence(rng)
    if kind < 0.14:  # keyword spam
        word = rng.choice(WORDS)
        return " ".join([word] * rng.randint(40, 80))
    if kind < 0.17:  # shouting
        return " ".join(_sentence(rng) for _ in range(6)).upper()
    return " ".join(_sentence(rng) for _ in range(rng.randint(3, 12)))


FOOTERS = ("Share this page with your friends.", "All rights reserved by the site.", "Read more stories like this one.")


def generate_raw(config: RawConfig) -> None:
    """Write `num_shards` shards of pseudo-web documents; ~15% repeat earlier ones, ~5% are near copies."""
    rng = random.Random(config.seed)
    seen: list[str] = []
    for shard in range(config.num_shards):
        lines = []
        for i in range(config.docs_per_shard):
            roll = rng.random()
            if seen and roll < 0.10:
                text = rng.choice(seen)  # exact duplicate
            elif seen and roll < 0.15:
                text = "  " + rng.choice(seen).replace(" ", "   ", 3) + "\n"  # differs only in whitespace
            elif seen and roll < 0.20:
                text = rng.choice(seen) + " " + rng.choice(FOOTERS)  # a near copy: same page, a footer added
            else:
                text = _document(rng)
                seen.append(text)
            doc = {"id": f"{shard}-{i}", "url": f"https://example.org/{shard}/{i}", "text": text}
            lines.append(orjson.dumps(doc) + b"\n")
        with fsspec.open(f"{config.output_path}/part-{shard:05d}.jsonl.zst", "wb", compression="zstd") as f:
            f.write(b"".join(lines))


# ---- 2. clean: normalize, filter, deduplicate ---------------------------------------------------

@dataclass(frozen=True)
class CleanConfig:
    input_path: str
    output_path: str
    min_words: int = MIN_WORDS
    max_symbol_ratio: float = 0.10
    max_top_word_ratio: float = 0.30
    max_upper_ratio: float = 0.50


_SPACES = re.compile(r"\s+")


def normalize(doc: dict) -> dict:
    text = _SPACES.sub(" ", unicodedata.normalize("NFC", doc["text"])).strip()
    return {**doc, "text": text}


def quality_filter(config: CleanConfig):
    """A predicate that counts, under `filter/<reason>`, every document it drops."""

    def keep(doc: dict) -> bool:
        text = doc["text"]
        words = text.split()
        letters = sum(c.isalpha() for c in text)
        reason = None
        if len(words) < config.min_words:
            reason = "too_short"
        elif sum(not (c.isalnum() or c.isspace() or c in ".,;:'!?-") for c in text) > config.max_symbol_ratio * len(text):
            reason = "symbols"
        elif Counter(w.lower() for w in words).most_common(1)[0][1] > config.max_top_word_ratio * len(words):
            reason = "repetitive"
        elif letters and sum(c.isupper() for c in text) > config.max_upper_ratio * letters:
            reason = "shouting"
        if reason:
            counters.increment(f"filter/{reason}")
            return False
        counters.increment("filter/kept")
        return True

    return keep


def content_hash(doc: dict) -> str:
    return hashlib.blake2b(doc["text"].encode(), digest_size=16).hexdigest()


def doc_text(doc: dict) -> str:
    return doc["text"]


def clean(config: CleanConfig) -> None:
    pipeline = (
        Dataset.from_files(f"{config.input_path}/*.jsonl.zst")
        .load_jsonl()
        .map(_counted("docs/in"))
        .map(normalize)
        .filter(quality_filter(config))
        .deduplicate(content_hash)
        .map(_counted("docs/exact_dedup"))
        .deduplicate_fuzzy(doc_text)
        .map(_counted("docs/out"))
        .write_jsonl(f"{config.output_path}/part-{{shard:05d}}.jsonl.zst", skip_existing=True)
    )
    _run_and_record(pipeline, config.output_path)


# ---- 3. tokens -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class TokenizeConfig:
    input_path: str
    output_path: str


def tokenize(config: TokenizeConfig) -> None:
    """Bytes then a newline as end-of-document, into a token cache (part-NNNNN.npy + ledger.json)."""
    records = Dataset.from_files(f"{config.input_path}/*.jsonl.zst").load_jsonl().map(_counted("docs/in"))
    pipeline = tokenize_dataset(records, config.output_path, tokenizer="byte", eod_token="\n")
    paths = _run_and_record(pipeline, config.output_path)
    finish_token_cache(paths, config.output_path)


def _counted(name: str):
    def count(doc):
        counters.increment(name)
        return doc

    count.__qualname__ = f"count[{name}]"
    return count


def _run_and_record(pipeline: Dataset, output_path: str) -> list[str]:
    """Run on the flow backend and keep its counters and timing next to the outputs."""
    start = time.perf_counter()
    execution = flow_backend().execute(pipeline)
    paths = list(execution)
    stats = {"seconds": time.perf_counter() - start, "shards": len(paths), "counters": dict(execution.counters)}
    with fsspec.open(f"{output_path}/stats.json", "wb") as f:
        f.write(orjson.dumps(stats, option=orjson.OPT_INDENT_2 | orjson.OPT_SORT_KEYS))
    return paths


# ---- 4. train a tiny model with the TPU training-step adapter -----------------------------------

@dataclass(frozen=True)
class TrainConfig:
    tokens: str
    output_path: str
    tpu_type: str = TPU_TYPE
    batch_size: int = 16
    seq_len: int = 128
    num_steps: int = 300
    checkpoint_every: int = 100
    seed: int = 0


def train(config: TrainConfig) -> None:
    from marin.training import tiny_lm, train_on_tpu

    start = time.perf_counter()
    result = train_on_tpu(
        tiny_lm.train_step,
        tiny_lm.init_state,
        config.tokens,
        tpu_type=config.tpu_type,
        batch_size=config.batch_size,
        seq_len=config.seq_len,
        num_steps=config.num_steps,
        checkpoint_path=f"{config.output_path}/checkpoints",
        checkpoint_every=config.checkpoint_every,
        seed=config.seed,
        log_every=10,
    )
    record = {"steps": result.step, "seconds": time.perf_counter() - start, "final": result.metrics,
              "history": result.history, "mesh": result.mesh, "processes": result.num_processes}
    with fsspec.open(f"{config.output_path}/train.json", "wb") as f:
        f.write(orjson.dumps(record, option=orjson.OPT_INDENT_2))


# ---- 5. summary -----------------------------------------------------------------------------------

@dataclass(frozen=True)
class SummaryConfig:
    raw: str
    clean: str
    tokens: str
    train: str
    output_path: str


def _read_json(path: str) -> dict:
    with fsspec.open(path, "rb") as f:
        return orjson.loads(f.read())


def summarize(config: SummaryConfig) -> None:
    clean_stats = _read_json(f"{config.clean}/stats.json")
    token_stats = _read_json(f"{config.tokens}/stats.json")
    training = _read_json(f"{config.train}/train.json")
    c = clean_stats["counters"]
    docs_in, kept, docs_out = c.get("docs/in", 0), c.get("filter/kept", 0), c.get("docs/out", 0)
    exact = c.get("docs/exact_dedup", 0)
    summary = {
        "documents": {"raw": docs_in, "after_filters": kept, "after_exact_dedup": exact, "after_dedup": docs_out,
                      "tokenized": token_stats["counters"].get("docs/in", 0)},
        "near_duplicates_removed": exact - docs_out,
        "dropped_by_filter": {k.removeprefix("filter/"): v for k, v in sorted(c.items()) if k.startswith("filter/") and k != "filter/kept"},
        "dedup_rate": (kept - docs_out) / kept if kept else 0.0,
        "clean_docs_per_second": docs_in / clean_stats["seconds"] if clean_stats["seconds"] else None,
        "tokens": token_stats["counters"].get("tokenize/tokens", 0),
        "train": {"steps": training["steps"], "final_loss": training["final"].get("loss"), "seconds": training["seconds"],
                  "devices": math.prod(training.get("mesh", {}).values()) if training.get("mesh") else None},
        "loss_curve": [(h["step"], h["loss"]) for h in training["history"]],
    }
    with fsspec.open(f"{config.output_path}/summary.json", "wb") as f:
        f.write(orjson.dumps(summary, option=orjson.OPT_INDENT_2))
    _plot(summary, f"{config.output_path}/summary.png")


def _plot(summary: dict, path: str) -> None:
    import io

    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4))
    stages = ["raw", "after_filters", "after_exact_dedup", "after_dedup"]
    labels = ["raw", "filtered", "exact dedup", "near dedup"]
    left.bar(labels, [summary["documents"].get(s, 0) for s in stages], color=["#999", "#4a7", "#27a", "#a52"])
    left.set_title(f"documents per stage (dedup rate {summary['dedup_rate']:.1%}, "
                   f"{summary.get('near_duplicates_removed', 0):,} near copies)")
    steps, losses = zip(*summary["loss_curve"]) if summary["loss_curve"] else ((), ())
    right.plot(steps, losses, marker="o")
    right.set_xlabel("step")
    right.set_ylabel("loss (nats/byte)")
    right.set_title("tiny byte-level LM")
    fig.tight_layout()
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100)
    plt.close(fig)
    with fsspec.open(path, "wb") as f:
        f.write(buffer.getvalue())


def format_summary(summary: dict) -> str:
    d = summary["documents"]
    lines = [
        "quickstart summary",
        f"  documents   raw {d['raw']:,} -> filtered {d['after_filters']:,} -> exact dedup {d.get('after_exact_dedup', 0):,}"
        f" -> near dedup {d['after_dedup']:,} ({summary.get('near_duplicates_removed', 0):,} near copies removed)",
        "  dropped     " + ", ".join(f"{k} {v:,}" for k, v in summary["dropped_by_filter"].items()),
        f"  dedup rate  {summary['dedup_rate']:.1%}   clean throughput {summary['clean_docs_per_second'] or 0:,.0f} docs/s",
        f"  tokens      {summary['tokens']:,}",
        f"  training    {summary['train']['steps']} steps on {summary['train'].get('devices') or '?'} devices, "
        f"final loss {summary['train']['final_loss']:.3f} "
        f"(loss {summary['loss_curve'][0][1]:.3f} at step {summary['loss_curve'][0][0]})" if summary["loss_curve"] else "",
    ]
    return "\n".join(line for line in lines if line)


# ---- the experiment -------------------------------------------------------------------------------

def build_steps(min_words: int = MIN_WORDS, num_steps: int = TRAIN_STEPS,
                docs_per_shard: int = DOCS_PER_SHARD) -> list[ExecutorStep]:
    raw = ExecutorStep(
        name="quickstart/raw",
        fn=generate_raw,
        config=RawConfig(this_output_path(), versioned(NUM_RAW_SHARDS), versioned(docs_per_shard), versioned(0)),
        description="A deterministic synthetic crawl with duplicates and low-quality pages.",
    )
    cleaned = ExecutorStep(
        name="quickstart/clean",
        fn=clean,
        config=CleanConfig(output_path_of(raw), this_output_path(), min_words=versioned(min_words)),
        description="Normalize, filter with quality heuristics, exact-dedup, remove near duplicates.",
    )
    tokens = ExecutorStep(
        name="quickstart/tokens",
        fn=tokenize,
        config=TokenizeConfig(output_path_of(cleaned), this_output_path()),
        description="Byte-level tokens for training.",
    )
    trained = ExecutorStep(
        name="quickstart/train",
        fn=train,
        config=TrainConfig(output_path_of(tokens), this_output_path(), num_steps=versioned(num_steps)),
        description="A tiny byte-level LM trained with the TPU adapter.",
    )
    summary = ExecutorStep(
        name="quickstart/summary",
        fn=summarize,
        config=SummaryConfig(output_path_of(raw), output_path_of(cleaned), output_path_of(tokens), output_path_of(trained), this_output_path()),
        description="Documents per stage, dedup rate, throughput, loss curve.",
    )
    return [raw, cleaned, tokens, trained, summary]


def start_ray() -> None:
    """Join RAY_ADDRESS, or start an embedded Ray whose node looks like one v4-8 TPU host."""
    import ray

    from marin.tpu import simulated_host
    from zephyr import create_backend, set_flow_backend
    from zephyr.backends.ray_local import start_local_ray

    if not ray.is_initialized():
        if os.environ.get("RAY_ADDRESS"):
            ray.init()
        else:  # JAX in the workers sees 4 CPU devices, as on a v4-8 host's 4 chips
            # workers in this interpreter (no per-run `uv run` venv), dashboard on a free port, quiet
            print(f"quickstart: {start_local_ray(log_to_driver=False, **simulated_host(TPU_TYPE))}", flush=True)
    set_flow_backend(create_backend("ray", max_parallelism=32, memory="512MiB"))


def _size_options(args: list[str] | None) -> tuple[argparse.Namespace, list[str]]:
    """The run's size (`--docs-per-shard`, `--train-steps`; the defaults make the full run) and
    the executor's own options (`--prefix`, `--dry_run`, ...), which draccus parses."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument("--docs-per-shard", type=int, default=DOCS_PER_SHARD)
    parser.add_argument("--train-steps", type=int, default=TRAIN_STEPS)
    return parser.parse_known_args(args)


def main(args=None) -> dict:
    import draccus

    from marin.execution import Executor
    from marin.execution.main import ExecutorMainConfig

    size, args = _size_options(args)
    config = draccus.parse(config_class=ExecutorMainConfig, args=args)
    if config.prefix is None and not os.environ.get("MARIN_PREFIX"):  # the default, not a MARIN_PREFIX to warn about
        # ./scratch: the steps' own names (`quickstart/raw`, ...) put the outputs under ./scratch/quickstart/
        config = dataclasses.replace(config, prefix=os.path.join(os.getcwd(), "scratch"))
    steps = build_steps(num_steps=size.train_steps, docs_per_shard=size.docs_per_shard)
    pending = Executor(config.prefix or os.environ["MARIN_PREFIX"]).dry_run(steps, config.run_only, out=lambda line: None)
    if not config.dry_run and any(action != "skip" for action in pending.values()):
        start_ray()  # only when some step will run: a finished quickstart reruns in seconds
    outcome = executor_main(steps, description="Quickstart: crawl -> clean -> dedup -> tokens -> tiny LM.", config=config)
    summary_path = next((p for p in outcome if "quickstart/summary-" in p), None)
    if summary_path and outcome[summary_path] in ("SUCCESS", "SKIPPED"):
        summary = _read_json(f"{summary_path}/summary.json")
        print(format_summary(summary))
        print(f"  written     {summary_path}/summary.json and summary.png")
    return outcome


if __name__ == "__main__":
    main()
