"""What the exactness checks of issue 21 cost: write_jsonl, write_parquet and read_jsonl.

Each is timed against the unchecked loop it replaced (written out here as it was), on the
same records, alternating rounds, best of `--rounds`:

- write_jsonl over N flat records `{"id", "url", "text", "score", "n"}` to `.jsonl.zst`;
- write_parquet over the same records, with no schema and with one given (`schema=`, where
  each batch is read back and compared);
- read_jsonl over a `corpus.py` corpus (JSONL.zst), where the scan for long digit runs
  (integers beyond 64 bits) is the added work.

    uv run python benchmarks/bench_exact_io.py --records 1000000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import time

import orjson

sys.path.insert(0, os.path.dirname(__file__))

from corpus import ensure_corpus  # noqa: E402

from zephyr.io import read_jsonl  # noqa: E402
from zephyr.io.files import atomic_write, open_input, open_output  # noqa: E402
from zephyr.io.jsonl import write_jsonl_file  # noqa: E402
from zephyr.io.parquet import write_parquet_file  # noqa: E402


def records(n: int) -> list[dict]:
    return [
        {"id": i, "url": f"https://example.com/{i}", "text": "lorem ipsum dolor sit amet " * 4, "score": i / 7, "n": i % 13}
        for i in range(n)
    ]


def unchecked_jsonl(items, path: str) -> None:
    """The writer before issue 21: orjson per item, nothing checked."""
    with open_output(path) as out:
        for item in items:
            out.write(orjson.dumps(item, option=orjson.OPT_APPEND_NEWLINE))


def unchecked_parquet(items, path: str) -> None:
    """The writer before issue 21: the first batch's inferred schema for the whole file."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    with atomic_write(path) as raw:
        writer = None
        for start in range(0, len(items), 8192):
            table = pa.Table.from_pylist(items[start : start + 8192], schema=None if writer is None else writer.schema)
            writer = writer or pq.ParquetWriter(raw, table.schema)
            writer.write_table(table)
        writer.close()


def unchecked_read(path: str):
    """The reader before issue 21: one orjson.loads per line, nothing else."""
    with open_input(path) as reader:
        while block := reader.read(256 * 1024):
            if not block.endswith(b"\n"):
                block += reader.readline()
            lines = block.split(b"\n")
            if block.endswith(b"\n"):
                lines.pop()
            yield from list(map(orjson.loads, lines))


def best(fn, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=1_000_000, help="flat records written per round")
    parser.add_argument("--rounds", type=int, default=3, help="rounds per variant (best is reported)")
    parser.add_argument("--corpus", default=os.path.join(tempfile.gettempdir(), "zephyr-bench-corpus-exact"), help="corpus directory")
    args = parser.parse_args()
    import pyarrow as pa

    items = records(args.records)
    with tempfile.TemporaryDirectory() as tmp:
        pairs = {
            "write_jsonl (.zst)": (lambda: unchecked_jsonl(items, f"{tmp}/a.jsonl.zst"), lambda: write_jsonl_file(items, f"{tmp}/b.jsonl.zst")),
            "write_parquet": (lambda: unchecked_parquet(items, f"{tmp}/a.parquet"), lambda: write_parquet_file(items, f"{tmp}/b.parquet")),
            "write_parquet(schema=)": (
                lambda: unchecked_parquet(items, f"{tmp}/a.parquet"),
                lambda: write_parquet_file(items, f"{tmp}/c.parquet", schema=pa.Table.from_pylist(items[:1]).schema),
            ),
        }
        info = ensure_corpus(args.corpus, num_shards=4, docs_per_shard=50_000)
        size = sum(os.path.getsize(p) for p in info.paths)
        pairs["read_jsonl (corpus)"] = (
            lambda: [sum(1 for _ in unchecked_read(p)) for p in info.paths],
            lambda: [sum(1 for _ in read_jsonl(p)) for p in info.paths],
        )
        for name, (old, new) in pairs.items():
            old_s, new_s = [], []
            for _ in range(args.rounds):  # alternate, so load drifts hit both alike
                old_s.append(best(old, 1))
                new_s.append(best(new, 1))
            o, n = min(old_s), min(new_s)
            print(f"{name:24s} unchecked {o:7.3f} s   checked {n:7.3f} s   overhead {100 * (n - o) / o:+6.1f}%")
        print(f"(corpus: {len(info.paths)} shards, {size / 1e6:.1f} MB compressed; {args.records:,} records written)")


if __name__ == "__main__":
    main()
