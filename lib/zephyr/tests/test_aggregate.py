"""`group_by(key).agg(...)` against a plain-Python oracle, in the engine and on records.

The oracle groups the input's records in one pass (keys told apart by type and value, as the
shuffle does), and computes each aggregation with builtins. Float values are multiples of 1/4
of small size, so every order of adding them gives the same sum.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from zephyr import Dataset, agg, col, create_backend

KEYS = st.one_of(st.sampled_from(["a", "b", "é", ""]), st.integers(-2, 2), st.booleans(), st.none())
NUMBERS = st.one_of(st.none(), st.integers(-(2**70), 2**70), st.integers(-5, 5), st.integers(-40, 40).map(lambda i: i / 4))
records_strategy = st.lists(
    st.fixed_dictionaries({"d": KEYS, "n": NUMBERS, "u": st.one_of(st.none(), st.text(max_size=3))},
                          optional={"e": st.sampled_from(["x", "y"])}),
    min_size=0, max_size=30)


def _key(value: Any) -> Any:
    """The oracle's grouping: by type and value (1, 1.0 and True are three keys)."""
    return (type(value).__name__, value)


def oracle(records: list[dict], keys: list[str]) -> dict:
    groups: dict = {}
    for r in records:
        k = tuple(_key(r.get(name)) for name in keys)
        groups.setdefault(k, []).append(r)
    out = {}
    for k, rows in groups.items():
        n = [r.get("n") for r in rows if r.get("n") is not None]
        u = [r.get("u") for r in rows]
        present_u = [x for x in u if x is not None]
        out[k] = {
            "docs": len(rows),
            "with_n": len(n),
            "total": sum(n) if n else None,
            "lo": min(present_u) if present_u else None,
            "hi": max(n) if n else None,
            "avg": sum(n) / len(n) if n else None,
            "first_u": u[0],
            "all_u": u,
        }
    return out


def run(shards: list[list[dict]], keys: list[str], columnar: bool, work: str) -> tuple[dict, dict]:
    paths = []
    for i, records in enumerate(shards):
        paths.append(os.path.join(work, f"in-{i}.jsonl"))
        with open(paths[-1], "w") as f:
            f.writelines(json.dumps(r) + "\n" for r in records)  # json.dumps's spaced form
    os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
    try:
        ds = Dataset.from_files(paths).load_jsonl().group_by(keys if len(keys) > 1 else keys[0], num_output_shards=2).agg(
            docs=agg.count(), with_n=agg.count("n"), total=agg.sum("n"), lo=agg.min("u"), hi=col("n").max(),
            avg=agg.mean(col("n")), first_u=agg.first("u"), all_u=agg.collect("u"))
        execution = create_backend("sync", progress=False, scratch_dir=os.path.join(work, f"s{columnar}")).execute(ds)
        got = {tuple(_key(r[name]) for name in keys): {k: v for k, v in r.items() if k not in keys} for r in execution}
        return got, dict(execution.counters)
    finally:
        os.environ.pop("ZEPHYR_COLUMNAR", None)


@settings(max_examples=30, deadline=None)
@given(shards=st.lists(records_strategy, min_size=1, max_size=3), two_keys=st.booleans(), columnar=st.booleans())
def test_aggregations_match_plain_python(shards, two_keys, columnar):
    keys = ["d", "e"] if two_keys else ["d"]
    with tempfile.TemporaryDirectory(prefix="zephyr-agg-") as work:
        got, _ = run(shards, keys, columnar, work)
    want = oracle([r for shard in shards for r in shard], keys)
    assert got == want


def test_a_count_ships_one_partial_row_per_key_per_block(tmp_path):
    """Partial aggregation: 3 files of 3,000 records over 5 keys cross the shuffle as at most
    3 x 5 rows, in the engine and on records (where a block is up to 65,536 records)."""
    shards = [[{"d": "abcde"[i % 5], "n": i} for i in range(3000)] for _ in range(3)]
    for columnar in (True, False):
        got, counters = run(shards, ["d"], columnar, str(tmp_path))
        assert {k[0][1]: v["docs"] for k, v in got.items()} == dict.fromkeys("abcde", 1800)
        assert counters["zephyr/shuffle_records"] <= 15, counters
        assert counters.get("zephyr/python_expressions", 0) == 0
        assert (counters.get("zephyr/engine_blocks", 0) == 3) == columnar


def test_the_engine_computes_partials_in_polars_where_it_can(tmp_path):
    """A typed key and typed inputs: Polars computes the partial rows (no expression in Python);
    a key column of several kinds in one block goes to Python, with the same result."""
    typed = [[{"d": "ab"[i % 2], "n": i, "u": str(i)} for i in range(50)]]
    mixed = [[{"d": ["ab"[i % 2], i % 2][i % 3 == 0], "n": i, "u": str(i)} for i in range(50)]]
    for shards, python in ((typed, 0), (mixed, 1)):
        got, counters = run(shards, ["d"], True, str(tmp_path))
        assert got == oracle(shards[0], ["d"])
        assert counters.get("zephyr/python_expressions", 0) == python


def test_shortcuts_and_key_forms(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps({"d": d, "n": n}) + "\n" for d, n in [("a", 1), ("b", 2), ("a", 3)]))
    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s"))
    base = Dataset.from_files([str(path)]).load_jsonl()
    assert sorted(backend.execute(base.group_by("d").count()), key=str) == [{"d": "a", "count": 2}, {"d": "b", "count": 1}]
    assert sorted(backend.execute(base.group_by(col("d")).sum("n")), key=str) == [{"d": "a", "sum_n": 4}, {"d": "b", "sum_n": 2}]
    assert sorted(map(str, backend.execute(base.deduplicate("d")))) == sorted(map(str, [{"d": "a", "n": 1}, {"d": "b", "n": 2}]))


def test_bad_calls_fail_when_built(tmp_path):
    base = Dataset.from_list([{"d": 1}])
    with pytest.raises(TypeError, match="column names or expressions"):
        base.group_by(lambda r: r["d"])
    with pytest.raises(TypeError, match="at least one"):
        base.group_by("d").agg()
    with pytest.raises(TypeError, match="needs an aggregation"):
        base.group_by("d").agg(n=3)
    with pytest.raises(ValueError, match="also key columns"):
        base.group_by("d").agg(d=agg.count())


def test_a_sum_of_strings_names_the_aggregation(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_text('{"d": "a", "n": "high"}\n')
    ds = Dataset.from_files([str(path)]).load_jsonl().group_by("d").agg(total=agg.sum("n"))
    with pytest.raises(Exception, match=r"sum\(col\('n'\)\) needs numbers, got str 'high'"):
        list(create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s"), max_user_retries=0).execute(ds))
