"""Watch a pipeline move: a small corpus cleaned slowly enough to follow on the status page.

    uv run zephyr --backend=ray --dashboard experiments/dashboard_demo.py [--out DIR] [--shards 24]

Open the URL it prints. The pipeline reads synthetic JSONL.zst shards, normalizes and filters
the documents (counting what it drops), deduplicates them (a shuffle: a second stage) and
writes the result. Each document takes a little time, one shard is a straggler, and one
shard fails on its first attempt with a bad record and succeeds when retried (on Ray, which
retries a user error once; elsewhere the run would stop there, so the demo only fails it
when the backend retries). Afterwards: `zephyr status OUT/clean` or `zephyr dashboard OUT/clean`.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import tempfile
import time

import zstandard
from zephyr import Dataset, counters, flow_backend
from zephyr.io import atomic_write

WORDS = ("data", "model", "token", "shard", "corpus", "filter", "quality", "train", "cluster", "node",
         "preempt", "retry", "write", "read", "stage", "merge", "hash", "dedup", "clean", "page")


def make_corpus(directory: str, shards: int, docs: int) -> list[str]:
    """`shards` JSONL.zst files of `docs` documents; some short, some shouting, some duplicated."""
    rng = random.Random(15)
    paths = []
    for s in range(shards):
        lines = []
        for i in range(docs):
            n = rng.randint(3, 60)
            text = " ".join(rng.choice(WORDS) for _ in range(n))
            if rng.random() < 0.05:
                text = text.upper()
            if rng.random() < 0.1:
                text = "a duplicate page about the cluster number " + str(rng.randint(0, 20))
            lines.append(json.dumps({"id": f"{s}-{i}", "text": text}))
        path = os.path.join(directory, f"raw-{s:03d}.jsonl.zst")
        with atomic_write(path) as f:
            f.write(zstandard.ZstdCompressor().compress(("\n".join(lines) + "\n").encode()))
        paths.append(path)
    return paths


def normalize(doc: dict, flaky_dir: str, straggler: str, delay: float, fail_once: bool) -> dict:
    if fail_once and doc["id"] == "5-0" and not os.path.exists(os.path.join(flaky_dir, "failed")):
        open(os.path.join(flaky_dir, "failed"), "w").close()
        raise ValueError(f"bad record {doc['id']}: unexpected control character in 'text'")
    time.sleep(delay * (15 if doc["id"].startswith(straggler) else 1))
    return {**doc, "text": " ".join(doc["text"].split())}


def keep(doc: dict) -> bool:
    words = doc["text"].split()
    if len(words) < 5:
        counters.increment("dropped/too_short")
        return False
    if doc["text"].isupper():
        counters.increment("dropped/shouting")
        return False
    counters.increment("kept")
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=None, help="where the corpus and the result go (default: a temp dir)")
    parser.add_argument("--shards", type=int, default=24, help="input shards (default 24)")
    parser.add_argument("--docs", type=int, default=400, help="documents per shard (default 400)")
    parser.add_argument("--delay", type=float, default=0.005, help="seconds of work per document (default 0.005)")
    args = parser.parse_args()
    out = args.out or tempfile.mkdtemp(prefix="zephyr-demo-")
    os.makedirs(os.path.join(out, "flaky"), exist_ok=True)
    for leftover in os.listdir(os.path.join(out, "flaky")):
        os.remove(os.path.join(out, "flaky", leftover))
    paths = make_corpus(os.path.join(out, "raw"), args.shards, args.docs)
    backend = flow_backend()
    fail_once = backend.max_user_retries > 0
    flaky, delay = os.path.join(out, "flaky"), args.delay
    pipeline = (
        Dataset.from_files(paths)
        .load_jsonl()
        .map(lambda d: normalize(d, flaky, "7-", delay, fail_once))
        .filter(keep)
        .deduplicate(lambda d: d["text"], num_output_shards=8)
        .write_jsonl(os.path.join(out, "clean", "part-{shard:03d}.jsonl.zst"))
    )
    written = list(backend.execute(pipeline))
    print(f"wrote {len(written)} files under {os.path.join(out, 'clean')}")


if __name__ == "__main__":
    main()
