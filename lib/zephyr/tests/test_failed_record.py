"""A user function's error names the record it failed on (issue 24, item 8): its index in the
shard, its `id` when it has one, and a short preview."""

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import pyarrow as pa
import pyarrow.parquet as pq

from zephyr import Dataset, ShardError, col, create_backend
from zephyr.execution.failed_record import PREVIEW_CHARS


def _run(ds, backend_name="sync", **options):
    backend = create_backend(backend_name, progress=False, **options)
    try:
        return list(backend.execute(ds))
    finally:
        backend.close()


def _expected(index: int, record, where: str | None = None) -> str:
    """The oracle: the record's description, written apart from the implementation."""
    preview = repr(record)
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 3] + "..."
    notes = [f"id {record['id']!r}"] if isinstance(record, dict) and "id" in record else []
    notes += [where] if where else []
    return f"record {index} of the shard" + (f" ({', '.join(notes)})" if notes else "") + f": {preview}"


class Boom(Exception):
    pass


def _fail_on(bad_id):
    def check(record):
        if record.get("id") == bad_id:
            raise Boom(f"cannot handle {bad_id}")
        return record
    return check


@settings(max_examples=25, deadline=None)
@given(n=st.integers(1, 30), data=st.data(), with_id=st.booleans(), keep_every=st.integers(1, 3))
def test_map_error_names_the_record_by_index_id_and_preview(tmp_path_factory, n, data, with_id, keep_every):
    """Regression (issue 24): the error named the shard and file, not which record."""
    bad = data.draw(st.integers(0, n - 1))
    records = [{"id": f"doc-{i}", "text": "x" * (i * 11)} for i in range(n)]
    if not with_id:
        records = [{"key": r["id"], "text": r["text"]} for r in records]
    path = tmp_path_factory.mktemp("in") / "part.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    field = "id" if with_id else "key"

    def check(record):
        if record[field] == f"doc-{bad}":
            raise Boom("cannot handle it")
        return record

    # a filter before the failing map: the record's index is its place in the shard as read
    ds = Dataset.from_files(str(path)).load_jsonl().filter(lambda r: True).map(check)
    with pytest.raises(ShardError) as info:
        _run(ds)
    line = f"{path}:{bad + 1}"  # JSON Lines: the line too
    assert info.value.record == _expected(bad, records[bad], line)
    assert f"at {_expected(bad, records[bad], line)}" in str(info.value)


def test_zephyr_errors_name_their_own_record_not_a_guess(tmp_path):
    """A loader's bad line names file:line itself; no record is guessed for zephyr's own errors."""
    path = tmp_path / "bad.jsonl"
    path.write_text('{"id": 1}\n{not json\n')
    with pytest.raises(ShardError) as info:
        _run(Dataset.from_files(str(path)).load_jsonl().map(lambda r: r))
    assert info.value.record is None and "bad.jsonl:2" in str(info.value)


def test_retry_log_says_what_failed_and_why_it_retries(caplog):
    """Regression (issue 24): a deterministic error was retried with only "retrying (1/1)"."""
    caplog.set_level(logging.WARNING, logger="zephyr")
    ds = Dataset.from_iterable([{"id": "a"}, {"id": "b"}]).map(_fail_on("b"))
    with pytest.raises(ShardError):
        _run(ds, "threadpool", max_parallelism=1, max_user_retries=1)
    [line] = [r.getMessage() for r in caplog.records if "retrying (1/1)" in r.getMessage()]
    assert "Boom: cannot handle b" in line and "record 1 of the shard (id 'b')" in line
    assert "max_user_retries=0" in line


def test_after_a_flat_map_no_record_is_guessed():
    """The record at fault is one flat_map made, not one the shard read: none is named."""
    ds = Dataset.from_iterable([[{"id": "a"}, {"id": "b"}]]).flat_map(lambda rows: rows).map(_fail_on("b"))
    with pytest.raises(ShardError) as info:
        _run(ds)
    assert info.value.record is None and "Boom: cannot handle b" in str(info.value)


@pytest.mark.ray
def test_the_record_survives_the_trip_back_from_a_ray_worker(ray_shared):
    """On Ray the ShardError is pickled in the worker: the record it names must come back."""
    records = [{"id": "a", "text": "fine"}, {"id": "b", "text": "bad"}]
    with pytest.raises(ShardError) as info:
        _run(Dataset.from_iterable(records).map(_fail_on("b")), "ray", max_parallelism=1, max_user_retries=0)
    assert info.value.record == _expected(1, records[1])


def test_no_record_is_guessed_for_a_key_function_a_reducer_or_a_writer(tmp_path):
    """Regression: the record blamed was the last one the shard had read, but a shuffle's key
    function and a reducer see records a batch ahead, and a writer's own errors (under
    zephyr/io) counted as user code: each named a wrong record (record 15 for a bad record 3).
    They name none now; a map before the shuffle still names its record."""
    records = [{"id": f"doc-{i}", "k": i % 3} for i in range(100)]
    del records[3]["k"]
    path = tmp_path / "in.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    source = Dataset.from_files(str(path)).load_jsonl()

    def count(k, rows):
        return {"k": k, "n": sum(1 for _ in rows)}

    with pytest.raises(ShardError) as info:
        _run(source.map(lambda r: r).group_by(lambda r: r["k"], count))
    assert info.value.error_type == "KeyError" and info.value.record is None

    with pytest.raises(ShardError) as info:
        _run(source.map(lambda r: {**r, "k": r["k"]}).group_by(lambda r: r["k"], count))
    assert info.value.record == _expected(3, records[3], f"{path}:4")  # the map's own error: its record

    def reducer(k, rows):
        if k == 2:
            raise Boom("reducer cannot handle key 2")
        return count(k, rows)

    with pytest.raises(ShardError) as info:
        _run(Dataset.from_iterable([{"id": i, "k": i % 5} for i in range(100)]).group_by(lambda r: r["k"], reducer, num_output_shards=1))
    assert info.value.error_type == "Boom" and info.value.record is None

    rows = [{"id": f"doc-{i}", "x": 1.0} for i in range(2000)]
    rows[5]["x"] = float("nan")
    with pytest.raises(ShardError) as info:
        _run(Dataset.from_iterable(rows).map(lambda r: r).write_jsonl(str(tmp_path / "out.jsonl")))
    assert info.value.error_type == "UnwritableRecordError" and "record 5" in str(info.value) and info.value.record is None


# ---- column expressions name their record too (issue 38, defect 6) ---------------------------
# Regression: `filter(lambda r: r["score"] > 0.5)` named "record 41234 ... {'id': 41234, 'score':
# 'high'}", but `filter(col("score") > 0.5)` and `with_columns(s=col("score") * 2.0)` named only
# the file, on every path (folded into the loader, Arrow batches, records).

BAD = 41234
SCORES = [{"id": i, "score": i % 7} for i in range(50_000)]
SCORES[BAD] = {"id": BAD, "score": "high"}

# (ops, what the op that raised was given for a record: the named record, plain Python)
COLUMN_FAILURES = {
    "filter folded into the loader": (lambda ds: ds.filter(col("score") > 0.5), lambda r: r),
    "with_columns": (lambda ds: ds.with_columns(s=col("score") * 2.0), lambda r: r),
    "filter after with_columns (a batch op)": (lambda ds: ds.with_columns(t=col("id") * 1.0).filter(col("score") > 0.5),
                                               lambda r: {**r, "t": r["id"] * 1.0}),
    # the filter folds into the loader, which filters before it projects: the record as read
    "filter after a select": (lambda ds: ds.select("score", "id").filter(col("score") > 0.5), lambda r: r),
    "filter after a map (records)": (lambda ds: ds.map(dict).filter(col("score") > 0.5), lambda r: r),
    "Python filter (as before)": (lambda ds: ds.filter(lambda r: r["score"] > 0.5), lambda r: r),
}


@pytest.fixture(params=["columnar", "records"])
def path_kind(request, monkeypatch):
    monkeypatch.setenv("ZEPHYR_COLUMNAR", "1" if request.param == "columnar" else "0")
    return request.param


@pytest.fixture(scope="module")
def scores_jsonl(tmp_path_factory):
    """The records as JSON lines, with a blank line early on (so a record's line is not its index + 1)."""
    path = tmp_path_factory.mktemp("scores") / "scores.jsonl"
    lines = [json.dumps(r, separators=(",", ":")) for r in SCORES]
    lines.insert(100, "")
    path.write_text("\n".join(lines) + "\n")
    return str(path)


@pytest.mark.parametrize("case", list(COLUMN_FAILURES))
def test_column_expression_error_names_the_record_and_line(scores_jsonl, path_kind, case):
    build, given = COLUMN_FAILURES[case]
    with pytest.raises(ShardError) as info:
        _run(build(Dataset.from_files(scores_jsonl).load_jsonl()))
    assert info.value.error_type == "TypeError"
    # the blank line at line 101 puts record 41234 on line 41236
    assert info.value.record == _expected(BAD, given(SCORES[BAD]), f"{scores_jsonl}:{BAD + 2}")


def test_the_engine_reads_these_records(scores_jsonl, path_kind):
    """The faults above land in the engine: it reads this file's blocks, the `score` column of
    the bad record's block held in Python (a failed shard's counters are dropped, so a run that
    does not fail shows it)."""
    backend = create_backend("sync", progress=False)
    try:
        execution = backend.execute(Dataset.from_files(scores_jsonl).load_jsonl().filter(col("id") >= 0))
        assert len(list(execution)) == len(SCORES)
        counts = execution.counters
    finally:
        backend.close()
    assert (counts.get("zephyr/engine_blocks", 0) > 0) == (path_kind == "columnar")


def test_parquet_expression_error_names_the_row(tmp_path, path_kind):
    """A filter pushed into the Parquet reader (evaluated on its rows: `/` by a column is not
    given to pyarrow) and a with_columns on its batches name the row they failed on."""
    rows = [{"id": i, "x": float(i), "y": 0.0 if i == 7 else 2.0} for i in range(20)]
    pq.write_table(pa.Table.from_pylist(rows), tmp_path / "a.parquet", row_group_size=5)
    source = Dataset.from_files(str(tmp_path / "a.parquet")).load_parquet()
    for ds in (source.filter(col("x") / col("y") > 1.0), source.with_columns(r=col("x") / col("y"))):
        with pytest.raises(ShardError) as info:
            _run(ds)
        assert info.value.error_type == "ZeroDivisionError" and info.value.record == _expected(7, rows[7])


def test_select_of_a_record_that_is_no_dict_names_it(path_kind):
    with pytest.raises(ShardError) as info:
        _run(Dataset.from_iterable([{"id": 1}, {"id": 2}, 5]).select("id"))
    assert info.value.record == _expected(2, 5)
