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


def _path(**params) -> str:
    step = fuzzy_dedup_step("fz/dedup", "gs://bucket/in", **params)
    return Executor("/p").plan([step]).steps[-1].output_path


def test_cc_rounds_keeps_the_path_and_the_new_fields_count_only_off_their_defaults():
    """cc_rounds decides only whether the components converge, never what a converged run
    writes: a step that failed with NotConvergedError reruns at its own path with more rounds.
    cluster_field / kept_field name output fields: another name is another output, while their
    defaults leave the path of a step written before they existed as it was."""
    from marin.execution.hashing import version_of

    base = _path()
    assert _path(cc_rounds=64) == base
    assert _path(cluster_field="fuzzy_cluster", kept_field="fuzzy_kept") == base
    assert len({base, _path(cluster_field="c"), _path(kept_field="k"), _path(threshold=0.7)}) == 4
    step = fuzzy_dedup_step("fz/dedup", "gs://bucket/in")
    recorded = version_of(step, lambda dep: dep.name)["config"]
    assert not {"cluster_field", "kept_field", "cc_rounds"} & set(recorded)  # as before the fields existed
    assert {"threshold", "seed", "annotate"} <= set(recorded)


def test_a_plain_input_path_counts_in_the_output_path(tmp_path):
    """The executor leaves plain config values out of the hash: two input directories given as
    strings got one output path, so the second run found the first's SUCCESS and returned the
    first input's documents for the second input."""
    other = Executor("/p").plan([fuzzy_dedup_step("fz/dedup", "gs://bucket/other")]).steps[-1].output_path
    assert _path() != other and _path() == _path()
    outputs = []
    for seed in (0, 1):
        docs = tmp_path / f"in{seed}"
        docs.mkdir()
        write_docs(DocsConfig(str(docs), seed))
        step = fuzzy_dedup_step("fz/dedup", str(docs), text_field="body", num_output_shards=1)
        result = Executor(str(tmp_path / "prefix"), poll_interval=0.05).run([step])
        (path,) = result  # SUCCESS, or SKIPPED when it took the first input's output for its own
        outputs.append(sorted(r["body"] for r in read(path)))
    assert outputs[0] != outputs[1]  # the second input's documents, not the first's
    assert list(result.values()) == ["SUCCESS"]
