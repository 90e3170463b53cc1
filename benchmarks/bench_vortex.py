"""Is the Vortex path usable? Write and read N flat records as Vortex and as Parquet through
zephyr's writers and readers, and as Vortex through `vortex-data` alone (the hand-written
baseline: records -> one Arrow table -> `vortex.io.write`; `vortex.open(...).to_arrow()` ->
rows), alternating rounds, best of `--rounds`; also a filtered, projected read.

    uv run python benchmarks/bench_vortex.py --records 200000 --rounds 3
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile

sys.path.insert(0, os.path.dirname(__file__))

from bench_exact_io import best, records  # noqa: E402  (the same rows and timing as the exact-I/O bench)
from machine import load_average  # noqa: E402

from zephyr import col  # noqa: E402
from zephyr.io.load import InputFileSpec, load_parquet, load_vortex  # noqa: E402
from zephyr.io.parquet import write_parquet_file  # noqa: E402
from zephyr.io.vortex import write_vortex_file  # noqa: E402


def plain_vortex_write(rows: list[dict], path: str) -> None:
    import pyarrow as pa
    import vortex

    vortex.io.write(pa.Table.from_pylist(rows), path)


def plain_vortex_read(path: str) -> list[dict]:
    import vortex

    return vortex.open(path).to_arrow().read_all().to_pylist()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--records", type=int, default=200_000)
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    rows = records(args.records)
    print(f"load before: {load_average()}")
    with tempfile.TemporaryDirectory() as d:
        paths = {k: os.path.join(d, f"{k}") for k in ("z.vortex", "z.parquet", "plain.vortex")}
        arms = {
            "write vortex (zephyr)": lambda: write_vortex_file(rows, paths["z.vortex"]),
            "write parquet (zephyr)": lambda: write_parquet_file(rows, paths["z.parquet"]),
            "write vortex (plain)": lambda: plain_vortex_write(rows, paths["plain.vortex"]),
        }
        results = {name: [] for name in arms}
        for _ in range(args.rounds):  # alternate the arms, round by round
            for name, fn in arms.items():
                results[name].append(best(fn, 1))
        reads = {
            "read vortex (zephyr)": lambda: sum(1 for _ in load_vortex(paths["z.vortex"])),
            "read parquet (zephyr)": lambda: sum(1 for _ in load_parquet(paths["z.parquet"])),
            "read vortex (plain)": lambda: len(plain_vortex_read(paths["plain.vortex"])),
            "filtered read vortex (zephyr)": lambda: sum(1 for _ in load_vortex(
                InputFileSpec(paths["z.vortex"], columns=["id"], filter_expr=col("n") == 3))),
            "filtered read parquet (zephyr)": lambda: sum(1 for _ in load_parquet(
                InputFileSpec(paths["z.parquet"], columns=["id"], filter_expr=col("n") == 3))),
        }
        results.update({name: [] for name in reads})
        for _ in range(args.rounds):
            for name, fn in reads.items():
                results[name].append(best(fn, 1))
        assert list(load_vortex(paths["z.vortex"])) == rows  # the figures are of a correct path
        sizes = {k: os.path.getsize(p) for k, p in paths.items()}
    for name, times in results.items():
        print(f"{name:32s} {min(times):7.3f} s  ({args.records / min(times) / 1e6:.2f} M rows/s)")
    print("sizes:", ", ".join(f"{k} {v / 2**20:.1f} MiB" for k, v in sizes.items()))
    print(f"load after: {load_average()}")


if __name__ == "__main__":
    main()
