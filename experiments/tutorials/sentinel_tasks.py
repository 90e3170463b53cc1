"""Idempotent Ray tasks with sentinel files: the job-script pattern of the infra guide, runnable.

    uv run python experiments/tutorials/sentinel_tasks.py [--work-dir DIR] [--num-files N]
    uv run python -m marin.run.ray_run --cluster local -- python experiments/tutorials/sentinel_tasks.py --work-dir /tmp/s

A driver dispatches one `@ray.remote` task per input file. Each task scores the documents of
its file (a toy "toxicity" score: the share of flagged words) and writes the scores to its
output file, then writes a sentinel `<output>.COMPLETE`. A task whose sentinel exists returns at
once, so the job can be rerun after any crash or preemption and redoes only the files whose
sentinel is missing: a file is done when its sentinel exists, never because its output does
(a task killed mid-write may leave a partial output; the rerun overwrites it).

For data processing, Zephyr gives the same guarantee without the bookkeeping
(`write_jsonl(..., skip_existing=True)`; see lib/zephyr/README.md); this pattern is for work
that is not a dataset pipeline. Inputs are generated under `--work-dir` (default: a directory
in the system temp dir) on the first run. Prints `SENTINEL_TASKS {json}` with what each run did.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile

import fsspec
import ray

from marin.utils import fsspec_exists, fsspec_glob, rebase_file_path

FLAGGED = {"awful", "stupid", "hate"}
WORDS = ["what", "a", "lovely", "awful", "day", "i", "hate", "stupid", "rain", "and", "love", "sun"]


def get_sentinel_path(output_path: str) -> str:
    return f"{output_path}.COMPLETE"


def finalize_sentinel(sentinel_path: str, content: str = "Task Completed") -> None:
    with fsspec.open(sentinel_path, "w") as f:
        f.write(content)


def score(text: str) -> float:
    words = text.split()
    return sum(word in FLAGGED for word in words) / max(1, len(words))


@ray.remote(num_cpus=1, max_retries=3)  # a task lost with its worker runs again
def classify_file(input_path: str, output_path: str) -> str:
    """Score every document of `input_path` into `output_path`; "skipped" if already done."""
    sentinel = get_sentinel_path(output_path)
    if fsspec_exists(sentinel):  # short-circuit: this file was finished by an earlier run
        return "skipped"
    with fsspec.open(input_path, "r") as src, fsspec.open(output_path, "w", compression="infer") as out:
        for line in src:
            doc = json.loads(line)
            out.write(json.dumps({"id": doc["id"], "toxicity": score(doc["text"])}) + "\n")
    finalize_sentinel(sentinel)
    return "done"


def make_inputs(work_dir: str, num_files: int, docs_per_file: int = 20) -> None:
    """Deterministic toy threads, written once."""
    for i in range(num_files):
        path = f"{work_dir}/input/threads-{i:03d}.jsonl"
        if fsspec_exists(path):
            continue
        with fsspec.open(path, "w", auto_mkdir=True) as f:
            for j in range(docs_per_file):
                text = " ".join(WORDS[(i * 7 + j * k) % len(WORDS)] for k in range(1, 9))
                f.write(json.dumps({"id": f"{i}-{j}", "text": text}) + "\n")


def run(work_dir: str, num_files: int) -> dict[str, int]:
    """Dispatch one task per input file and collect them as they finish (`ray.wait`)."""
    make_inputs(work_dir, num_files)
    inputs = fsspec_glob(f"{work_dir}/input/*.jsonl")
    outputs = [rebase_file_path(f"{work_dir}/input", path, f"{work_dir}/output", ".scores.jsonl.gz") for path in inputs]
    pending = [classify_file.remote(i, o) for i, o in zip(inputs, outputs)]
    counts = {"done": 0, "skipped": 0}
    while pending:
        finished, pending = ray.wait(pending, num_returns=1)
        counts[ray.get(finished[0])] += 1
    return counts


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work-dir", default=os.path.join(tempfile.gettempdir(), "marin-sentinel-tasks"))
    parser.add_argument("--num-files", type=int, default=8)
    args = parser.parse_args(argv)
    ray.init(address=os.environ.get("RAY_ADDRESS") or "local", log_to_driver=False)  # the job's cluster, or our own
    counts = run(args.work_dir, args.num_files)
    print("SENTINEL_TASKS", json.dumps({"work_dir": args.work_dir, **counts}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
