"""A user function's error names the record it failed on (issue 24, item 8): its index in the
shard, its `id` when it has one, and a short preview."""

import json
import logging

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, ShardError, create_backend
from zephyr.execution.failed_record import PREVIEW_CHARS


def _run(ds, backend_name="sync", **options):
    backend = create_backend(backend_name, progress=False, **options)
    try:
        return list(backend.execute(ds))
    finally:
        backend.close()


def _expected(index: int, record: dict) -> str:
    """The oracle: the record's description, written apart from the implementation."""
    preview = repr(record)
    if len(preview) > PREVIEW_CHARS:
        preview = preview[: PREVIEW_CHARS - 3] + "..."
    ident = f" (id {record['id']!r})" if "id" in record else ""
    return f"record {index} of the shard{ident}: {preview}"


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
    assert info.value.record == _expected(bad, records[bad])
    assert f"at {_expected(bad, records[bad])}" in str(info.value)


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
    assert info.value.record == _expected(3, records[3])  # the map's own error: its record

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
