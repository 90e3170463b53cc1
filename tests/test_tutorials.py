"""experiments/tutorials/: the hello world a guide submits to a cluster, and the sentinel-file task
pattern, run on the test session's Ray. (Their submission to a token-auth cluster, as the guides
write it, is in test_seed_instructions.py.)"""

from __future__ import annotations

import gzip
import importlib.util
import json
import sys
from pathlib import Path

import pytest
from ray import cloudpickle

from marin.execution.executor import ExecutorMainConfig, executor_main

pytestmark = pytest.mark.ray

TUTORIALS = Path(__file__).resolve().parents[1] / "experiments" / "tutorials"


def _load(name: str):
    """The tutorial script as a module; Ray ships its functions by value (workers cannot import it)."""
    spec = importlib.util.spec_from_file_location(f"tutorial_{name}", TUTORIALS / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    spec.loader.exec_module(module)
    cloudpickle.register_pickle_by_value(module)
    return module


def test_hello_world_step_greets_from_ray_tasks_and_is_skipped_on_rerun(ray_shared, tmp_path):
    hello = _load("hello_world")
    for _ in range(2):
        executor_main(ExecutorMainConfig(prefix=str(tmp_path)), steps=[hello.hello])
    (out,) = tmp_path.glob("tutorials/hello_world-*/greetings.jsonl")
    greetings = [json.loads(line)["greeting"] for line in out.read_text().splitlines()]
    assert greetings == ["Hello, world!", "Hello, Zephyr!", "Hello, Marin!"]


def _expected_scores(input_file: Path) -> list[dict]:
    """Plain-Python oracle: the share of flagged words of each document."""
    flagged = {"awful", "stupid", "hate"}
    docs = [json.loads(line) for line in input_file.read_text().splitlines()]
    return [{"id": d["id"], "toxicity": sum(w in flagged for w in d["text"].split()) / len(d["text"].split())}
            for d in docs]  # fmt: skip


def test_sentinel_tasks_do_each_file_once_and_redo_only_unfinished_ones(ray_shared, tmp_path):
    tasks = _load("sentinel_tasks")
    assert tasks.run(str(tmp_path), num_files=5) == {"done": 5, "skipped": 0}
    assert tasks.run(str(tmp_path), num_files=5) == {"done": 0, "skipped": 5}

    # A task killed mid-write: a partial output and no sentinel. The rerun redoes that file only.
    victim = tmp_path / "output" / "threads-002.scores.jsonl.gz"
    Path(f"{victim}.COMPLETE").unlink()
    victim.write_bytes(gzip.compress(b'{"id": "2-0", "tox'))
    assert tasks.run(str(tmp_path), num_files=5) == {"done": 1, "skipped": 4}

    for i in range(5):
        out = tmp_path / "output" / f"threads-{i:03d}.scores.jsonl.gz"
        scores = [json.loads(line) for line in gzip.decompress(out.read_bytes()).splitlines()]
        assert scores == _expected_scores(tmp_path / "input" / f"threads-{i:03d}.jsonl")
        assert Path(f"{out}.COMPLETE").read_text() == "Task Completed"
    assert sorted(p.name for p in (tmp_path / "output").iterdir()) == sorted(
        name for i in range(5) for name in (f"threads-{i:03d}.scores.jsonl.gz", f"threads-{i:03d}.scores.jsonl.gz.COMPLETE")
    )
