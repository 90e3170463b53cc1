"""marin.processing.fuzzy_dedup: the step runs deduplicate_fuzzy over its input, and its
parameters are versioned (another threshold, another output path)."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass

import pytest
import zstandard

from marin.execution import Executor, ExecutorStep, output_path_of, this_output_path, versioned
from marin.processing.fuzzy_dedup import fuzzy_dedup_step


@dataclass(frozen=True)
class DocsConfig:
    output_path: str
    seed: int = 0


def write_docs(config: DocsConfig) -> None:
    """Two shards: 10 random documents, each followed later by a copy with one word changed."""
    rng = random.Random(config.seed)
    originals = [[f"w{rng.randrange(10_000)}" for _ in range(200)] for _ in range(10)]
    copies = [words[:100] + ["changed"] + words[101:] for words in originals]
    shards = [originals, copies]
    for s, docs in enumerate(shards):
        with open(f"{config.output_path}/docs-{s}.jsonl", "w") as f:
            for i, words in enumerate(docs):
                f.write(json.dumps({"id": f"{s}-{i}", "body": " ".join(words)}) + "\n")


def read(path: str) -> list[dict]:
    import glob

    out = []
    for p in sorted(glob.glob(f"{path}/data-*.jsonl.zst")):
        out += [json.loads(line) for line in zstandard.ZstdDecompressor().decompressobj().decompress(open(p, "rb").read()).splitlines()]
    return out


def test_step_removes_near_copies_and_versions_its_parameters(tmp_path):
    docs = ExecutorStep(name="fz/docs", fn=write_docs, config=DocsConfig(this_output_path(), versioned(0)))
    step = fuzzy_dedup_step("fz/dedup", output_path_of(docs), text_field="body", num_output_shards=2)
    other = fuzzy_dedup_step("fz/dedup", output_path_of(docs), text_field="body", num_output_shards=2, threshold=0.7)
    executor = Executor(str(tmp_path), poll_interval=0.05)
    result = executor.run([step, other])
    assert set(result.values()) == {"SUCCESS"} and len(result) == 3  # two dedup outputs: the threshold is versioned
    paths = [p for p in result if "/fz/dedup-" in p]
    for path in paths:
        assert sorted(r["id"] for r in read(path)) == [f"0-{i}" for i in range(10)]  # the copies (shard 1) dropped


def test_step_refuses_unknown_parameters():
    with pytest.raises(TypeError, match="thresold"):
        fuzzy_dedup_step("x", "in", thresold=0.7)
