"""A step that runs a Zephyr pipeline: the config carries paths, the function runs the plan.

    uv run python experiments/zephyr_step_example.py --prefix /tmp/x

Two steps: `documents` writes a few JSONL shards of toy documents; `long_documents` keeps
the documents with at least `min_words` words and adds a word count, as a Zephyr pipeline
on `zephyr.flow_backend()` (a local threadpool unless configured otherwise, e.g. Ray). The
pipeline writes with `skip_existing=True`, so a step preempted half-way redoes only the
shards that were not finished.
"""

from __future__ import annotations

import functools
import json
from dataclasses import dataclass

from zephyr import Dataset, flow_backend
from zephyr.io import atomic_write

from marin.execution import ExecutorStep, executor_main, output_path_of, this_output_path, versioned

WORDS = "the quick brown fox jumps over a lazy dog while zephyr moves data between steps".split()


@dataclass(frozen=True)
class DocumentsConfig:
    num_shards: int
    docs_per_shard: int
    output_path: str


def write_documents(config: DocumentsConfig) -> None:
    """Write `num_shards` JSONL files of documents with 1..len(WORDS) words each."""
    for shard in range(config.num_shards):
        with atomic_write(f"{config.output_path}/docs-{shard:05d}.jsonl", "w") as f:
            for i in range(config.docs_per_shard):
                n = (shard * config.docs_per_shard + i) % len(WORDS) + 1
                f.write(json.dumps({"id": f"{shard}-{i}", "text": " ".join(WORDS[:n])}) + "\n")


@dataclass(frozen=True)
class FilterConfig:
    input_path: str
    min_words: int
    output_path: str


def _long_enough(min_words: int, doc: dict) -> bool:
    return len(doc["text"].split()) >= min_words


def _with_word_count(doc: dict) -> dict:
    return {**doc, "words": len(doc["text"].split())}


def filter_documents(config: FilterConfig) -> None:
    """Keep documents with at least `min_words` words; one output shard per input file."""
    pipeline = (
        Dataset.from_files(f"{config.input_path}/*.jsonl")
        .load_jsonl()
        .filter(functools.partial(_long_enough, config.min_words))
        .map(_with_word_count)
        .write_jsonl(f"{config.output_path}/data-{{shard:05d}}.jsonl", skip_existing=True)
    )
    list(flow_backend().execute(pipeline))


documents = ExecutorStep(
    name="zephyr_example/documents",
    fn=write_documents,
    config=DocumentsConfig(num_shards=versioned(3), docs_per_shard=versioned(20), output_path=this_output_path()),
)

long_documents = ExecutorStep(
    name="zephyr_example/long_documents",
    fn=filter_documents,
    config=FilterConfig(input_path=output_path_of(documents), min_words=versioned(8), output_path=this_output_path()),
)

if __name__ == "__main__":
    executor_main(steps=[long_documents], description="Filter toy documents with a Zephyr pipeline.")
