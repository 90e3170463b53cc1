"""What watching for columns no record had costs (`zephyr.expr.presence`, issue 38).

A run of `filter(<expression>)`, `with_columns` and `select` ops on the record path watches its
input until every column the run reads has been seen once, then chains the rest of the stream on
as it is.
This times the three ops of a typical chain over `--rows` dicts in process, with and without the
watch, alternated `--repeats` times (best CPU time of each), and the same with a misspelt column
(never seen: the watching generator stays on every record, the worst case). The outputs are
compared with each other in every run. Last, the watch alone over the records (a column every
record has, and one none has).

    uv run python benchmarks/bench_column_watch.py
"""

from __future__ import annotations

import argparse
import os
import sys
import time

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from machine import load_average  # noqa: E402

from zephyr import col  # noqa: E402
from zephyr.expr.presence import watched  # noqa: E402
from zephyr.plan import ops as op  # noqa: E402
from zephyr.plan.ops import watch_points  # noqa: E402


def chain(name: str) -> list:
    """filter -> with_columns -> select, reading `name` where the score is read."""
    return [op.FilterExpr(col(name).is_null() | (col(name) > 3)), op.WithColumns((("s", col(name) * 2.0),)), op.Select(("id", "s"))]


def run(rows: list, ops: list, watch: bool) -> tuple[float, list]:
    """The ops applied as a shard applies them (`execution/shard.py`): a watch where a run of column ops begins."""
    stream = iter(rows)
    points = watch_points(ops) if watch else {}
    for index, record in enumerate(ops):
        stream = record.apply(watched(stream, points[index]) if index in points else stream)
    start = time.process_time()
    out = list(stream)
    return time.process_time() - start, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=300_000)
    parser.add_argument("--repeats", type=int, default=15)
    args = parser.parse_args()
    rows = [{"id": i, "score": i % 7, "text": "lorem ipsum dolor sit amet " * 2} for i in range(args.rows)]
    print(f"load average before: {load_average()}")
    for name in ("score", "scroe"):
        best = {False: float("inf"), True: float("inf")}
        outputs = {}
        for _ in range(args.repeats):
            for watch in (False, True):
                seconds, outputs[watch] = run(rows, chain(name), watch)
                best[watch] = min(best[watch], seconds)
        assert outputs[False] == outputs[True]
        extra = (best[True] - best[False]) / args.rows * 1e9
        print(f"column {name!r}: plain {best[False]:.3f} CPU s, watched {best[True]:.3f} CPU s "
              f"({best[True] / best[False]:.3f}x, {extra:+.0f} ns per record for three ops)")
    for name in ("score", "scroe"):  # the watch alone, the records passed through as they are
        plain = min(_timed(lambda: iter(rows)) for _ in range(args.repeats))
        alone = min(_timed(lambda: watched(rows, {(name,)})) for _ in range(args.repeats))
        print(f"watch alone, column {name!r}: {(alone - plain) / args.rows * 1e9:+.0f} ns per record")
    print(f"load average after: {load_average()}")


def _timed(make) -> float:
    stream = make()
    start = time.process_time()
    for _ in stream:
        pass
    return time.process_time() - start


if __name__ == "__main__":
    main()
