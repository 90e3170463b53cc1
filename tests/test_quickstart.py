"""The quickstart from a user's seat: runs end to end, a rerun skips every step, and changing a
versioned parameter reruns exactly the steps that depend on it. Its document counts are checked
against a count of the raw shards in plain Python (`count_apart`), not against the summary's own
arithmetic."""

import importlib.util
import itertools
import json
import os
import subprocess
import sys
import textwrap
import unicodedata
from pathlib import Path

import orjson
import pytest
import zstandard

REPO = Path(__file__).resolve().parents[1]


def _quickstart():
    spec = importlib.util.spec_from_file_location("quickstart_oracle", REPO / "experiments" / "quickstart.py")
    module = sys.modules[spec.name] = importlib.util.module_from_spec(spec)  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def _records(directory: Path) -> list[dict]:
    records = []
    for path in sorted(directory.glob("part-*.jsonl.zst")):
        with zstandard.ZstdDecompressor().stream_reader(path.open("rb")) as f:
            records += [json.loads(line) for line in f.read().decode().splitlines()]
    return records


def _shingles(text: str, n: int = 5) -> set[str]:
    words = text.lower().split()
    return {" ".join(words[i : i + n]) for i in range(max(1, len(words) - n + 1))}


# `deduplicate_fuzzy`'s banding at its default threshold 0.8, as its docstring gives it: a pair at
# Jaccard similarity J shares a bucket with probability 1 - (1 - J**ROWS)**BANDS
BANDS, ROWS = 20, 11


def _merge_moments(group: list[str]) -> tuple[float, float]:
    """Mean and variance of the number of documents LSH removes from one group of copies, each
    pair merged independently with its S-curve probability (every subset of pairs enumerated)."""
    pairs = []
    for a, b in itertools.combinations(range(len(group)), 2):
        sa, sb = _shingles(group[a]), _shingles(group[b])
        pairs.append((a, b, 1 - (1 - (len(sa & sb) / len(sa | sb)) ** ROWS) ** BANDS))
    assert len(pairs) <= 10, f"a group of {len(group)} copies: too many pairs to enumerate"
    mean = square = 0.0
    for found in itertools.product((False, True), repeat=len(pairs)):
        weight, parent = 1.0, list(range(len(group)))
        for hit, (a, b, p) in zip(found, pairs):
            weight *= p if hit else 1 - p
            if hit:
                parent = [parent[b] if x == parent[a] else x for x in parent]
        removed = len(group) - len(set(parent))
        mean, square = mean + weight * removed, square + weight * removed**2
    return mean, square - mean**2


def count_apart(raw: Path, clean: Path) -> dict:
    """The clean step's counts from its raw shards, in plain Python, and checks of its output.

    The quality rules are the experiment's own (`quality_filter`, the spec); normalizing,
    exact duplicates and near-duplicate groups are counted here. The generator makes a near copy
    by appending one of `FOOTERS` to an earlier page, so a group is the texts that are one page
    with or without a footer. MinHash LSH merges a pair with a probability that rises with its
    Jaccard similarity (word 5-grams), so the near-dedup count is a range: the expected count
    under the documented banding, +- 6 standard deviations (at least 3 documents).
    """
    from zephyr import counters

    qs = _quickstart()
    keep = qs.quality_filter(qs.CleanConfig("", ""))
    docs = _records(raw)
    with counters.collecting() as dropped:
        kept = [t for t in (" ".join(unicodedata.normalize("NFC", d["text"]).split()) for d in docs) if keep({"text": t})]
    distinct = list(dict.fromkeys(kept))
    groups: dict[str, list[str]] = {}
    for text in distinct:
        page = next((text[: -len(f) - 1] for f in qs.FOOTERS if text.endswith(" " + f)), text)
        groups.setdefault(page, []).append(text)
    moments = [_merge_moments(g) for g in groups.values() if len(g) > 1]
    mean = len(distinct) - sum(m for m, _ in moments)
    spread = max(3.0, 6 * sum(v for _, v in moments) ** 0.5)

    out = [d["text"] for d in _records(clean)]
    assert len(out) == len(set(out)), "an exact duplicate survived"
    assert set(out) <= set(distinct), "the output has a text the input (normalized, filtered) does not"
    assert {g[0] for g in groups.values() if len(g) == 1} <= set(out), "a page with no copy was removed"
    assert all(set(g) & set(out) for g in groups.values()), "a group of copies lost every member"
    return {"raw": len(docs), "after_filters": len(kept), "after_exact_dedup": len(distinct), "after_dedup": len(out),
            "dropped": {k.removeprefix("filter/"): v for k, v in dropped.items() if k != "filter/kept"},
            "after_dedup_bounds": (mean - spread, mean + spread)}


@pytest.mark.slow  # a clean step of 12,000 documents on threadpool (no Ray)
def test_clean_step_matches_an_independent_count_of_the_raw_data(tmp_path):
    from zephyr import create_backend, set_flow_backend

    qs = _quickstart()
    qs.generate_raw(qs.RawConfig(str(tmp_path / "raw")))
    set_flow_backend(create_backend("threadpool", max_parallelism=2, progress=False))
    try:
        qs.clean(qs.CleanConfig(str(tmp_path / "raw"), str(tmp_path / "clean")))
    finally:
        set_flow_backend(None)
    c = orjson.loads((tmp_path / "clean" / "stats.json").read_bytes())["counters"]
    expected = count_apart(tmp_path / "raw", tmp_path / "clean")
    assert (c["docs/in"], c["filter/kept"], c["docs/exact_dedup"], c["docs/out"]) == (
        expected["raw"], expected["after_filters"], expected["after_exact_dedup"], expected["after_dedup"])
    assert {k.removeprefix("filter/"): v for k, v in c.items() if k.startswith("filter/") and k != "filter/kept"} == expected["dropped"]
    low, high = expected["after_dedup_bounds"]
    assert low <= c["docs/out"] <= high < expected["after_exact_dedup"]


# the end-to-end test's size: a quarter of the default corpus (12,000 documents) and 30 training
# steps of 300 (its loss, seeded, has fallen from 3.40 at step 10 to 2.40 by step 30); the executor's
# skipping and reruns do not depend on the size, and the clean step's counts at the default size
# are checked against `count_apart` by the threadpool test above
DOCS_PER_SHARD, TRAIN_STEPS = 375, 30
SIZE = ("--docs-per-shard", str(DOCS_PER_SHARD), "--train-steps", str(TRAIN_STEPS))


def test_the_size_options_reach_the_steps_and_the_default_is_the_full_run(tmp_path):
    """A dry run (nothing runs, no Ray): without options, the 8 x 1,500 documents and 300 steps
    the quickstart documents; with the test's options, the smaller run (other output paths)."""
    from marin.execution import Executor

    qs = _quickstart()

    def planned(steps):
        return set(Executor(str(tmp_path)).dry_run(steps, None, out=lambda line: None))

    default = set(qs.main(["--prefix", str(tmp_path), "--dry_run", "true"]))
    assert default == planned(qs.build_steps(min_words=20, num_steps=300, docs_per_shard=1500))
    [raw] = [s for s in qs.build_steps() if s.name == "quickstart/raw"]
    assert raw.config.num_shards.value * raw.config.docs_per_shard.value == 12_000
    smaller = set(qs.main(["--prefix", str(tmp_path), "--dry_run", "true", *SIZE]))
    assert smaller == planned(qs.build_steps(num_steps=TRAIN_STEPS, docs_per_shard=DOCS_PER_SHARD)) and not smaller & default


def run(*args, timeout=600):
    return subprocess.run([sys.executable, *args], cwd=REPO, capture_output=True, text=True, timeout=timeout, env=os.environ.copy())


@pytest.mark.ray
@pytest.mark.slow
def test_quickstart_end_to_end_then_skip_then_partial_rerun(tmp_path):
    prefix = tmp_path / "prefix"
    first = run("experiments/quickstart.py", "--prefix", str(prefix), *SIZE)
    assert first.returncode == 0, first.stderr[-4000:]
    assert "quickstart summary" in first.stdout
    [summary_dir] = list((prefix / "quickstart").glob("summary-*"))
    summary = orjson.loads((summary_dir / "summary.json").read_bytes())
    docs = summary["documents"]
    assert docs["raw"] == _quickstart().NUM_RAW_SHARDS * DOCS_PER_SHARD
    assert docs["raw"] > docs["after_filters"] > docs["after_dedup"] == docs["tokenized"] > 0
    assert set(summary["dropped_by_filter"]) == {"too_short", "symbols", "repetitive", "shouting"}
    assert sum(summary["dropped_by_filter"].values()) == docs["raw"] - docs["after_filters"]
    assert 0.05 < summary["dedup_rate"] < 0.5
    assert docs["after_filters"] > docs["after_exact_dedup"] > docs["after_dedup"]  # near copies survive exact dedup
    assert summary["near_duplicates_removed"] == docs["after_exact_dedup"] - docs["after_dedup"] > 0
    # the counts against the raw shards, counted apart (regression, issue 38: checked only against themselves)
    [raw_dir] = (prefix / "quickstart").glob("raw-*")
    [clean_dir] = (prefix / "quickstart").glob("clean-*")
    expected = count_apart(raw_dir, clean_dir)
    assert {k: docs[k] for k in ("raw", "after_filters", "after_exact_dedup", "after_dedup")} == {
        k: expected[k] for k in ("raw", "after_filters", "after_exact_dedup", "after_dedup")}
    assert summary["dropped_by_filter"] == expected["dropped"]
    low, high = expected["after_dedup_bounds"]
    assert low <= docs["after_dedup"] <= high
    assert summary["dedup_rate"] == pytest.approx((expected["after_filters"] - expected["after_dedup"]) / expected["after_filters"])
    assert "near copies removed" in first.stdout
    losses = [loss for _, loss in summary["loss_curve"]]
    assert summary["train"]["steps"] == TRAIN_STEPS and losses[-1] < losses[0] - 0.5  # it learned
    assert summary["train"]["devices"] == 4  # data-parallel over the simulated v4-8 host's 4 chips
    assert (summary_dir / "summary.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    outputs = {p.name: p.stat().st_mtime_ns for p in (prefix / "quickstart").iterdir()}

    second = run("experiments/quickstart.py", "--prefix", str(prefix), *SIZE)
    assert second.returncode == 0, second.stderr[-4000:]
    assert "quickstart summary" in second.stdout
    assert {p.name: p.stat().st_mtime_ns for p in (prefix / "quickstart").iterdir()} == outputs  # nothing rewritten

    # a different versioned parameter for the clean step: raw is reused, everything downstream reruns
    script = tmp_path / "rerun.py"
    script.write_text(textwrap.dedent(
        f"""
        import importlib.util, sys, cloudpickle
        spec = importlib.util.spec_from_file_location("quickstart", "experiments/quickstart.py")
        qs = sys.modules["quickstart"] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(qs)
        cloudpickle.register_pickle_by_value(qs)  # Ray workers cannot import experiments/
        import ray.cloudpickle; ray.cloudpickle.register_pickle_by_value(qs)  # Ray pickles with its own copy
        from marin.execution import Executor
        qs.start_ray()
        outcome = Executor({str(prefix)!r}).run(qs.build_steps(min_words=30, num_steps={TRAIN_STEPS}, docs_per_shard={DOCS_PER_SHARD}))
        for path, status in sorted(outcome.items()):
            print(path.rsplit("/", 1)[-1].rsplit("-", 1)[0], status)
        """
    ))
    third = run(str(script))
    assert third.returncode == 0, third.stderr[-4000:]
    statuses = dict(line.split() for line in third.stdout.splitlines() if line.split()[-1] in ("SUCCESS", "SKIPPED"))
    assert statuses == {"raw": "SKIPPED", "clean": "SUCCESS", "tokens": "SUCCESS", "train": "SUCCESS", "summary": "SUCCESS"}
    assert len(list((prefix / "quickstart").glob("raw-*"))) == 1
    assert len(list((prefix / "quickstart").glob("clean-*"))) == 2
