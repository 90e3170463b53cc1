"""experiments/zephyr_step_example.py: a step whose function runs a Zephyr pipeline."""

from __future__ import annotations

import glob
import importlib.util
import json
import os
import sys

import pytest

from marin.execution import SKIPPED, Executor

pytest.importorskip("zephyr")

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))


@pytest.fixture(scope="module")
def example():
    path = os.path.join(REPO_ROOT, "experiments", "zephyr_step_example.py")
    spec = importlib.util.spec_from_file_location("zephyr_step_example", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up by name
    spec.loader.exec_module(module)
    yield module
    del sys.modules[spec.name]


def read_records(pattern):
    return [json.loads(line) for path in sorted(glob.glob(pattern)) for line in open(path)]


def test_zephyr_pipeline_step_filters_and_resumes(example, tmp_path):
    executor = Executor(str(tmp_path), poll_interval=0.05)
    result = executor.run([example.long_documents])
    docs_path, long_path = result
    assert list(result.values()) == ["SUCCESS", "SUCCESS"]

    docs = read_records(f"{docs_path}/*.jsonl")
    expected = [{**d, "words": len(d["text"].split())} for d in docs if len(d["text"].split()) >= 8]
    assert len(docs) == 60 and read_records(f"{long_path}/data-*.jsonl") == expected
    assert len(glob.glob(f"{long_path}/data-*.jsonl")) == 3

    assert executor.run([example.long_documents]) == {docs_path: SKIPPED, long_path: SKIPPED}
