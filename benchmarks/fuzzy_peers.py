"""The peers of benchmarks/bench_fuzzy_dedup.py: datatrove's MinHash dedup, and Daft.

- **datatrove** (`bench` group): its four steps, `MinhashDedupSignature` -> `MinhashDedupBuckets`
  -> `MinhashDedupCluster` -> `MinhashDedupFilter` + `JsonlWriter`, on `LocalPipelineExecutor`
  with `cores` worker processes: one signature and one filter task per input file, one bucket
  task per band, and one cluster task (datatrove's union-find is one process). Mapping of our
  settings: `MinhashConfig(n_grams=5, num_buckets=20, hashes_per_bucket=11,
  hash_config=HashConfig(precision=64, hash_fc="sha1"))` (20 bands x 11 rows = our 220
  permutations; its default shingle hash, xxhash, fails here: datatrove passes it a `str`,
  which xxhash 4.1 refuses, "Strings must be encoded before hashing"); its
  default text normalisation (lower case, whitespace, punctuation, digits, diacritics; the
  corpus has only lower-case letter words, so it changes nothing) and, instead of its English
  tokenizer (which needs spaCy), a tokenizer that splits on whitespace, as ours does. Its
  hashes are its own (SHA-1 of each shingle, 64-bit universal permutations), not rensa's, so
  its candidates differ from ours by chance only. Each cluster keeps the root of datatrove's
  union-by-size, not always the first document, so quality is scored per cluster.
- **Daft** runs in its own environment (`daft_fuzzy.py`, see there): daft 0.7.26 pins
  pyarrow < 26, below the project's pyarrow, so it cannot join the `bench` group.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time

__all__ = ["run_daft", "run_datatrove"]


def _whitespace_tokenizer():
    from datatrove.utils.word_tokenizers import WordTokenizer

    class Whitespace(WordTokenizer):
        """Words are what `str.split` returns: the shingles of zephyr's MinHasher."""

        def word_tokenize(self, text: str) -> list[str]:
            return text.split()

        def sent_tokenize(self, text: str) -> list[str]:
            return [text]

        def span_tokenize(self, text: str) -> list[tuple[int, int]]:
            return [(0, len(text))]

    return Whitespace()


def run_datatrove(in_dir: str, out_dir: str, work: str, cores: int) -> dict:
    """datatrove's four MinHash steps over the JSONL files of `in_dir`; seconds per step."""
    from datatrove.executor import LocalPipelineExecutor
    from datatrove.pipeline.dedup.minhash import (MinhashConfig, MinhashDedupBuckets, MinhashDedupCluster, MinhashDedupFilter,
                                                  MinhashDedupSignature)
    from datatrove.pipeline.readers import JsonlReader
    from datatrove.pipeline.writers import JsonlWriter
    from datatrove.utils.hashing import HashConfig

    config = MinhashConfig(n_grams=5, num_buckets=20, hashes_per_bucket=11, hash_config=HashConfig(precision=64, hash_fc="sha1"))
    files = sorted(os.listdir(in_dir))
    shutil.rmtree(work, ignore_errors=True)  # datatrove skips the tasks its logs mark done
    sigs, buckets, clusters, logs = (os.path.join(work, f"datatrove-{n}") for n in ("sigs", "buckets", "clusters", "logs"))

    def reader():
        return JsonlReader(in_dir, glob_pattern="*.jsonl", text_key="text", id_key="id")

    steps = [
        ("signatures", [reader(), MinhashDedupSignature(output_folder=sigs, config=config, language=_whitespace_tokenizer())], len(files)),
        ("buckets", [MinhashDedupBuckets(input_folder=sigs, output_folder=buckets, config=config)], config.num_buckets),
        ("cluster", [MinhashDedupCluster(input_folder=buckets, output_folder=clusters, config=config)], 1),
        ("filter", [reader(), MinhashDedupFilter(input_folder=clusters), JsonlWriter(out_dir, compression=None)], len(files)),
    ]
    seconds = {}
    start = time.perf_counter()
    for name, pipeline, tasks in steps:
        t = time.perf_counter()
        LocalPipelineExecutor(pipeline, tasks=tasks, workers=min(tasks, cores), logging_dir=f"{logs}-{name}",
                              start_method="fork").run()
        seconds[name] = round(time.perf_counter() - t, 2)
    return {"seconds": time.perf_counter() - start, "steps_s": seconds}


def kept_ids(out_dir: str) -> set:
    """The `id` of every record in the JSONL files under `out_dir` (datatrove keeps its id as `id`)."""
    ids = set()
    for root, _, names in os.walk(out_dir):
        for name in names:
            if name.endswith((".jsonl", ".json")) and not name.startswith("."):
                with open(os.path.join(root, name), "rb") as f:
                    ids.update(json.loads(line)["id"] for line in f if line.strip())
    return ids


def run_daft(in_dir: str, out_dir: str, cores: int) -> dict:
    """benchmarks/daft_fuzzy.py in its own environment (`uv run --isolated --with daft`)."""
    script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "daft_fuzzy.py")
    cmd = ["uv", "run", "--isolated", "--no-project", "--with", "daft==0.7.26", "python", script, in_dir, out_dir, str(cores)]
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=1800)
    if proc.returncode != 0:
        return {"error": proc.stderr[-2000:]}
    return json.loads(proc.stdout.strip().splitlines()[-1])


if __name__ == "__main__":
    print(run_datatrove(*sys.argv[1:4], int(sys.argv[4])))
