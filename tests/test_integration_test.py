"""An integration test that is also a Ray job script: a two-step executor experiment, on the
Ray it runs on, checked against a count made here in plain Python.

    uv run python -m marin.run.ray_run --cluster local -- python tests/test_integration_test.py
    ray job submit --address http://127.0.0.1:8265 --working-dir . -- python tests/test_integration_test.py
    uv run python tests/test_integration_test.py [--prefix DIR]   # no cluster: an embedded Ray
    uv run pytest tests/test_integration_test.py                  # the test, on the test session's Ray

`integration/documents` writes 4 JSONL shards of documents, with repeated and too-short texts;
`integration/dedup` runs a Zephyr pipeline on the Ray backend (load, filter, exact dedup,
write). Outputs go under `--prefix`, else `$MARIN_PREFIX`, else a temporary directory. A run
on a prefix that already holds the outputs skips both steps and checks them again. It prints
`INTEGRATION_OK {json}` and exits non-zero when the outputs are wrong.
"""

from __future__ import annotations

import json
import os
import sys
import tempfile
from dataclasses import dataclass

import fsspec
import ray
from zephyr import Dataset, create_backend
from zephyr.io import atomic_write

from marin.execution.executor import (
    ExecutorMainConfig,
    ExecutorStep,
    executor_main,
    output_path_of,
    this_output_path,
    versioned,
)

try:  # a job on the cluster image has no pytest; the test run does
    import pytest

    pytestmark = pytest.mark.ray
except ImportError:
    pass

TEXTS = ["a b c d", "the quick brown fox", "a b c d", "hi", "one two three four five", "hi", "zephyr on ray"]
NUM_SHARDS = 4
MIN_WORDS = 3


@dataclass(frozen=True)
class DocumentsConfig:
    num_shards: int
    output_path: str


def write_documents(config: DocumentsConfig) -> None:
    """Shard `s` holds every text of TEXTS, tagged with its shard."""
    for shard in range(config.num_shards):
        with atomic_write(f"{config.output_path}/docs-{shard:05d}.jsonl", "w") as f:
            for i, text in enumerate(TEXTS):
                f.write(json.dumps({"id": f"{shard}-{i}", "text": text}) + "\n")


@dataclass(frozen=True)
class DedupConfig:
    input_path: str
    min_words: int
    output_path: str


def _long_enough(min_words: int):
    return lambda doc: len(doc["text"].split()) >= min_words


def dedup_documents(config: DedupConfig) -> None:
    """Keep one document per text, of those with at least `min_words` words (Zephyr on Ray)."""
    pipeline = (
        Dataset.from_files(f"{config.input_path}/*.jsonl")
        .load_jsonl()
        .filter(_long_enough(config.min_words))
        .deduplicate(lambda doc: doc["text"], num_output_shards=2)
        .write_jsonl(f"{config.output_path}/part-{{shard:05d}}.jsonl")
    )
    list(create_backend("ray", max_parallelism=2).execute(pipeline))


documents = ExecutorStep(
    name="integration/documents",
    fn=write_documents,
    config=DocumentsConfig(num_shards=versioned(NUM_SHARDS), output_path=this_output_path()),
)
dedup = ExecutorStep(
    name="integration/dedup",
    fn=dedup_documents,
    config=DedupConfig(input_path=output_path_of(documents), min_words=versioned(MIN_WORDS), output_path=this_output_path()),
)


def run_experiment(prefix: str) -> dict:
    """Run (or skip) both steps under `prefix` and read back what the dedup step wrote."""
    executor_main(ExecutorMainConfig(prefix=prefix), steps=[dedup])
    texts: list[str] = []
    fs, root = fsspec.core.url_to_fs(prefix)
    for path in sorted(fs.glob(f"{root}/integration/dedup-*/part-*.jsonl")):
        with fs.open(path) as f:
            texts += [json.loads(line)["text"] for line in f]
    return {"texts": sorted(texts)}


def expected() -> dict:
    """The oracle: plain Python over the same texts."""
    return {"texts": sorted({text for text in TEXTS if len(text.split()) >= MIN_WORDS})}


def main(argv: list[str]) -> int:
    prefix = argv[argv.index("--prefix") + 1] if "--prefix" in argv else os.environ.get("MARIN_PREFIX")
    prefix = prefix or tempfile.mkdtemp(prefix="marin-integration-")
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False)  # the job's cluster, or our own
    result = run_experiment(prefix)
    print("INTEGRATION_OK" if result == expected() else "INTEGRATION_FAILED", json.dumps(result), flush=True)
    return 0 if result == expected() else 1


def test_experiment_output_matches_plain_python_and_a_rerun_skips(ray_shared, tmp_path):
    assert run_experiment(str(tmp_path)) == expected() == {
        "texts": ["a b c d", "one two three four five", "the quick brown fox", "zephyr on ray"]
    }
    statuses = sorted(p.read_text().strip() for p in tmp_path.glob("integration/*/.executor_status"))
    assert statuses == ["SUCCESS", "SUCCESS"]
    assert run_experiment(str(tmp_path)) == expected()  # both steps skipped, outputs unchanged
    assert len(list(tmp_path.glob("integration/dedup-*"))) == 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
