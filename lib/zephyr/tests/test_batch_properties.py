"""The engine (`zephyr.engine`) against the record path: the same records out, or the same error.

Generated JSON-lines files (blocks of uniform records, which go columnar, mixed with what must
not: missing and extra keys, keys in another order, nulls, nested values, floats, unicode and
escapes, integers beyond 64 bits, blank, spaced and bad lines) run through generated pipelines
of column-expression ops (filter/select/with_columns/map_batches), a Python op here and there,
and a sink (write_jsonl; write_parquet, with and without a schema; deduplicate or group_by on
a column; reshard). Each runs once with
`ZEPHYR_COLUMNAR=0` (records all the way) and once in the engine; the output files must read
back the same (JSON lines: each line's values, types and key order; Parquet: byte for byte), or
both runs fail with the same error type. The engine writes a row no op changed as the line it
read, so its JSON may be spaced as the input was where the record path writes orjson's. The record path itself is checked
against the plain-Python oracle by `test_pipeline_properties.py`; the named tests below check
a few outputs against plain Python directly.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any

import orjson
import pyarrow as pa
import pytest
from hypothesis import event, given, settings
from hypothesis import strategies as st
from zephyr import Dataset, col, create_backend, lit
from zephyr.errors import ShardError
from zephyr.engine.scan import MAX_BLOCK, MIN_BLOCK, block_bytes

FIELDS = ["k", "s", "b", "n"]
text = st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=8)
texts = st.one_of(text, st.sampled_from(["a", "b", "", 'q"uote', "back\\slash", "tab\t", "nl\n", "\x01", "é", "𝒳", "\u2028"]))
ints = st.one_of(st.integers(-3, 3), st.integers(-(2**63), 2**63 - 1), st.integers(-(2**70), 2**70))
scalars = st.one_of(st.none(), st.booleans(), ints, st.floats(allow_nan=False, allow_infinity=False), texts)
nested = st.one_of(st.lists(scalars, max_size=2), st.dictionaries(st.sampled_from(FIELDS), scalars, max_size=2))


def _line(record: dict) -> bytes:
    try:
        return orjson.dumps(record)
    except orjson.JSONEncodeError:  # integers beyond 64 bits
        return json.dumps(record, ensure_ascii=False, separators=(",", ":")).encode()


@st.composite
def uniform_block(draw) -> list[bytes]:
    """Records with the same keys, in the same order, each of one type: the columnar case."""
    names = draw(st.lists(st.sampled_from(FIELDS), min_size=1, max_size=4, unique=True))
    kinds = {name: draw(st.sampled_from([texts, st.integers(-3, 3), st.booleans(), st.none()])) for name in names}
    rows = draw(st.integers(1, 12))
    lines = []
    for _ in range(rows):
        record = {name: draw(st.one_of(st.none(), kinds[name]) if draw(st.booleans()) else kinds[name]) for name in names}
        lines.append(_line(record))
    return lines


@st.composite
def odd_lines(draw) -> list[bytes]:
    """Lines the batch path must hand to the record reader (or that fail on both paths)."""
    record = draw(st.dictionaries(st.sampled_from(FIELDS), st.one_of(scalars, nested), max_size=4))
    line = _line(record)
    variant = draw(st.sampled_from(["as is", "spaced", "blank", "bad", "array", "nan"]))
    if variant == "spaced":
        line = json.dumps(record, ensure_ascii=True).encode()
    elif variant == "blank":
        line = b"  "
    elif variant == "bad":
        line = line[:-1]
    elif variant == "array":
        line = b"[1]"
    elif variant == "nan":
        line = b'{"k":NaN}'
    event(f"odd line: {variant}")
    return [line]


files = st.lists(st.lists(st.one_of(uniform_block(), uniform_block(), uniform_block(), odd_lines()), min_size=1, max_size=4)
                 .map(lambda blocks: b"\n".join(line for block in blocks for line in block) + b"\n"), min_size=1, max_size=3)


def table_identity(table: pa.Table) -> pa.Table:
    return table


def add_flag(table: pa.Table) -> pa.Table:
    return table.append_column("flag", pa.array([True] * table.num_rows))


def spoil_short_strings(table: pa.Table) -> pa.Table:
    """Turn each one-character `s` into bytes that are not UTF-8, as a user's
    `binary.view(string)` can: the record path's `to_pylist` raises on them."""
    at = table.schema.get_field_index("s")
    if at < 0 or not (pa.types.is_string(table.schema.field(at).type) or pa.types.is_large_string(table.schema.field(at).type)):
        return table
    import pyarrow.compute as pc

    s = table.column(at).combine_chunks()
    raw = s.view(pa.large_binary() if pa.types.is_large_string(s.type) else pa.binary())
    spoiled = pc.if_else(pc.equal(pc.utf8_length(s), 1), pc.binary_join_element_wise(raw, pa.scalar(b"\xff", raw.type), pa.scalar(b"", raw.type)), raw)
    return table.set_column(at, "s", spoiled.view(s.type))


def py_identity(record: Any) -> Any:
    return record


def ks_of_group(key, items):
    return {"key": key, "ks": [item.get("k") for item in items]}


def repr_k(record):
    return repr(record.get("k"))


def count_group(key, items):
    return {"key": key, "count": sum(1 for _ in items)}


COLUMN_OPS = {
    "filter k>0": lambda ds: ds.filter(col("k") > 0),
    "filter s!=a": lambda ds: ds.filter(col("s") != "a"),
    "filter b": lambda ds: ds.filter(col("b")),
    "filter s null": lambda ds: ds.filter(col("s").is_null() | (col("s").str_len() < 3)),
    "select s,k": lambda ds: ds.select("s", "k"),
    "with_columns len": lambda ds: ds.with_columns(n=col("s").str_len()),
    "with_columns copy+lit": lambda ds: ds.with_columns(k=col("s"), src=lit("w\"eb")),
    "with_columns float": lambda ds: ds.with_columns(half=col("k") * 0.5),
    "map_batches identity": lambda ds: ds.map_batches(table_identity),
    "map_batches flag": lambda ds: ds.map_batches(add_flag),
    "map_batches spoil": lambda ds: ds.map_batches(spoil_short_strings),
    "python map": lambda ds: ds.map(py_identity),
}
SINKS = {
    "write": lambda ds, out: ds.write_jsonl(out + "/w-{shard:03d}.jsonl"),
    "dedup s": lambda ds, out: ds.deduplicate(col("s"), num_output_shards=2).write_jsonl(out + "/d-{shard:03d}.jsonl"),
    "dedup k": lambda ds, out: ds.deduplicate(col("k"), num_output_shards=2).write_jsonl(out + "/d-{shard:03d}.jsonl"),
    "group_by s": lambda ds, out: ds.group_by(col("s"), count_group, num_output_shards=2).write_jsonl(out + "/g-{shard:03d}.jsonl"),
    "reshard": lambda ds, out: ds.reshard(2).write_jsonl(out + "/r-{shard:03d}.jsonl.gz"),
    "group_by b sorted": lambda ds, out: ds.group_by(col("b"), ks_of_group, sort_by=repr_k).write_jsonl(out + "/g-{shard:03d}.jsonl"),
    "parquet": lambda ds, out: ds.write_parquet(out + "/p-{shard:03d}.parquet"),
    "parquet schema": lambda ds, out: ds.write_parquet(out + "/p-{shard:03d}.parquet", schema=PARQUET_SCHEMA),
}
PARQUET_SCHEMA = pa.schema([("k", pa.int64()), ("s", pa.string()), ("b", pa.bool_()), ("n", pa.float64()), ("flag", pa.bool_())])


def run_pipeline(columnar: bool, inputs: list[str], ops: list[str], sink: str, out: str, memory=None) -> tuple[dict, Any]:
    """(output file name -> bytes, error type or None) of one run; records which path a block took."""
    os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
    try:
        ds = Dataset.from_files(inputs)
        ds = ds.load_parquet() if inputs[0].endswith(".parquet") else ds.load_jsonl()
        for name in ops:
            ds = COLUMN_OPS[name](ds)
        ds = SINKS[sink](ds, out)
        with tempfile.TemporaryDirectory(prefix="zephyr-batch-") as scratch:
            backend = create_backend("sync", progress=False, scratch_dir=scratch, memory=memory)
            try:
                execution = backend.execute(ds)
                list(execution)
                error = None
                if columnar:
                    event(f"blocks in the engine: {execution.counters.get('zephyr/engine_blocks', 0) > 0}")
            except Exception as e:  # noqa: BLE001  (compared between the two paths)
                error = type(e).__name__
            finally:
                backend.close()
    finally:
        os.environ.pop("ZEPHYR_COLUMNAR", None)
    outputs = {}
    for name in sorted(n for n in os.listdir(out) if not n.startswith(".")) if os.path.isdir(out) else []:
        with open(os.path.join(out, name), "rb") as f:
            outputs[name] = read_back(name, f.read())
    return outputs, error


def read_back(name: str, data: bytes) -> Any:
    """What a file holds: a JSON-lines file's records as exact JSON text (the stdlib reads
    integers of any size, keeps key order and tells 1 from 1.0); a Parquet file's bytes."""
    if name.endswith(".gz"):
        import gzip

        data, name = gzip.decompress(data), name[:-3]
    if not name.endswith(".jsonl"):
        return data
    return [json.dumps(json.loads(line), ensure_ascii=False, separators=(",", ":")) for line in data.splitlines()]


@settings(max_examples=40, deadline=None)
@given(contents=files, ops=st.lists(st.sampled_from(sorted(COLUMN_OPS)), max_size=3), sink=st.sampled_from(sorted(SINKS)))
def test_engine_and_record_paths_write_the_same_records(contents, ops, sink):
    with tempfile.TemporaryDirectory(prefix="zephyr-batch-case-") as work:
        inputs = []
        for i, data in enumerate(contents):
            inputs.append(os.path.join(work, f"in-{i}.jsonl"))
            with open(inputs[-1], "wb") as f:
                f.write(data)
        records = run_pipeline(False, inputs, ops, sink, os.path.join(work, "records"))
        batches = run_pipeline(True, inputs, ops, sink, os.path.join(work, "batches"))
    event(f"sink: {sink}; error: {records[1]}")
    for name in ops:
        event(f"op: {name}")
    assert batches[1] == records[1]
    if records[1] is None:
        assert batches[0] == records[0]


parquet_tables = st.lists(
    st.fixed_dictionaries({"k": st.one_of(st.none(), ints.filter(lambda i: -(2**63) <= i < 2**63)), "s": st.one_of(st.none(), texts),
                           "b": st.one_of(st.none(), st.booleans()), "n": st.one_of(st.none(), st.floats())}),
    min_size=1, max_size=20,
)


@settings(max_examples=25, deadline=None)
@given(tables=st.lists(parquet_tables, min_size=1, max_size=2), columns=st.sets(st.sampled_from(FIELDS), min_size=1),
       ops=st.lists(st.sampled_from(sorted(COLUMN_OPS)), max_size=3), sink=st.sampled_from(sorted(SINKS)),
       string_type=st.sampled_from([pa.string(), pa.large_string()]), spoil=st.booleans())
def test_parquet_in_the_engine_and_records_write_the_same(tables, columns, ops, sink, string_type, spoil):
    """Parquet row batches on the batch path (strings with escapes, as string or large_string
    (as Polars writes them), int64, bool, floats with NaN, nulls; with `spoil`, bytes that are
    not UTF-8 in the files' one-character strings, which Parquet readers do not check) against
    the record path."""
    import pyarrow.parquet as pq

    schema = pa.schema([("k", pa.int64()), ("s", string_type), ("b", pa.bool_()), ("n", pa.float64())])
    with tempfile.TemporaryDirectory(prefix="zephyr-batch-case-") as work:
        inputs = []
        for i, rows in enumerate(tables):
            inputs.append(os.path.join(work, f"in-{i}.parquet"))
            table = pa.Table.from_pylist(rows, schema=schema)
            if spoil:
                table = spoil_short_strings(table)
            pq.write_table(table.select([c for c in FIELDS if c in columns]), inputs[-1], row_group_size=7)
        records = run_pipeline(False, inputs, ops, sink, os.path.join(work, "records"))
        batches = run_pipeline(True, inputs, ops, sink, os.path.join(work, "batches"))
    event(f"sink: {sink}; error: {records[1]}")
    assert batches[1] == records[1]
    if records[1] is None:
        assert batches[0] == records[0]


def test_strings_that_are_not_utf8_fail_both_paths_alike(tmp_path):
    """A Parquet file whose string column holds bytes that are not UTF-8 (pyarrow reads them
    without a check), and a `map_batches` fn that makes such strings: the batch path fails as
    the record path does (a ShardError naming the source, from `to_pylist`), and writes nothing,
    where it used to copy the bytes into the output."""
    import pyarrow.parquet as pq

    rows = [{"k": i, "s": "x" if i == 3 else f"ok{i}"} for i in range(10)]
    spoiled = tmp_path / "spoiled.parquet"
    pq.write_table(spoil_short_strings(pa.Table.from_pylist(rows)), spoiled)
    clean = _write(tmp_path / "clean.jsonl", [orjson.dumps(r) for r in rows])
    cases = {
        "parquet": Dataset.from_files([str(spoiled)]).load_parquet().filter(col("k") >= 0),
        "map_batches": Dataset.from_files([clean]).load_jsonl().map_batches(spoil_short_strings),
    }
    for name, ds in cases.items():
        for columnar in (False, True):
            out = tmp_path / f"{name}-{columnar}"
            os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
            backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch"))
            try:
                with pytest.raises(ShardError, match="UnicodeDecodeError") as caught:
                    list(backend.execute(ds.write_jsonl(str(out / "o-{shard}.jsonl"))))
            finally:
                backend.close()
                os.environ.pop("ZEPHYR_COLUMNAR", None)
            assert os.path.basename(str(spoiled) if name == "parquet" else clean) in str(caught.value)
            assert not out.exists() or not [n for n in os.listdir(out) if not n.startswith(".")]
    # without the spoiled value, the same Parquet pipeline runs on batches
    pq.write_table(pa.Table.from_pylist(rows), spoiled)
    execution = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch")).execute(
        Dataset.from_files([str(spoiled)]).load_parquet().filter(col("k") >= 0).write_jsonl(str(tmp_path / "ok" / "o.jsonl")))
    list(execution)
    assert execution.counters.get("zephyr/tables_as_records", 0) == 0
    assert _read(tmp_path / "ok" / "o.jsonl") == b"".join(orjson.dumps(r) + b"\n" for r in rows)


def _read(path) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _write(path, lines: list[bytes]) -> str:
    with open(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    return str(path)


def test_uniform_blocks_run_on_batches_and_match_plain_python(tmp_path):
    """A filter + derived column + dedup on a column key, columnar end to end, against Python."""
    docs = [{"id": i, "text": t} for i, t in enumerate(["a", "bb", "a", "ccc", "bb", "é𝒳", 'q"'])]
    path = _write(tmp_path / "in.jsonl", [orjson.dumps(d) for d in docs])
    ds = (Dataset.from_files([path]).load_jsonl().with_columns(n=col("text").str_len()).filter(col("n") >= 2)
          .deduplicate(col("text")).write_jsonl(str(tmp_path / "out-{shard}.jsonl")))
    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch"))
    execution = backend.execute(ds)
    list(execution)
    seen, want = set(), []
    for d in docs:  # the oracle: plain Python
        if len(d["text"]) >= 2 and d["text"] not in seen:
            seen.add(d["text"])
            want.append({**d, "n": len(d["text"])})
    got = [json.loads(line) for line in _read(tmp_path / "out-0.jsonl").splitlines()]
    assert sorted(got, key=lambda d: d["id"]) == want
    assert execution.counters.get("zephyr/engine_blocks", 0) == 1
    assert not any(k.startswith("zephyr/python_columns/") for k in execution.counters)


def test_lines_the_engine_does_not_change_are_written_as_read(tmp_path):
    """An int beyond 64 bits, a key missing, keys reordered, a float, spaces, `json.dumps`'s
    escapes: each block stays in the engine, the filter keeps what plain Python keeps, and a
    kept line is written as it was read (so it reads back as its record, key order and all).
    The column beyond 64 bits is evaluated in Python, and the run counts it."""
    cases = [b'{"k":18446744073709551617}', b'{"k":1,"s":"a"}\n{"k":2}', b'{"k":1,"s":"a"}\n{"s":"b","k":2}',
             b'{"k":1.5}', b'{"k": 1, "s": "caf\\u00e9"}', b'{"k": null}\n\n{"k":0}']
    for i, data in enumerate(cases):
        path = _write(tmp_path / f"in-{i}.jsonl", [data])
        ds = Dataset.from_files([path]).load_jsonl().filter(col("k").is_not_null()).write_jsonl(str(tmp_path / f"o{i}.jsonl"))
        execution = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s")).execute(ds)
        list(execution)
        assert execution.counters.get("zephyr/engine_blocks", 0) == 1, data
        assert execution.counters.get("zephyr/python_columns/k", 0) == (1 if i == 0 else 0), data
        want = [line for line in data.split(b"\n") if line.strip() and json.loads(line).get("k") is not None]
        assert _read(tmp_path / f"o{i}.jsonl").splitlines() == want
    path = _write(tmp_path / "nan.jsonl", [b'{"k":1}', b'{"k":NaN}'])
    ds = Dataset.from_files([path]).load_jsonl().filter(col("k") > 0).write_jsonl(str(tmp_path / "nan-out.jsonl"))
    with pytest.raises(Exception, match=r"nan.jsonl:2"):
        list(create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s")).execute(ds))


def test_the_plan_shows_where_batches_become_records(tmp_path):
    path = _write(tmp_path / "in.jsonl", [b'{"k":1}'])
    ds = Dataset.from_files([path]).load_jsonl().with_columns(n=col("k")).map(py_identity).write_jsonl(str(tmp_path / "o.jsonl"))
    assert "load_jsonl() [batches] -> with_columns(n=col('k')) -> to_records -> map(py_identity)" in ds.describe()
    shuffled = Dataset.from_files([path]).load_jsonl().select("k").deduplicate(py_identity)
    assert "load_jsonl(columns=['k']) [batches] -> to_records => scatter(hash(py_identity)" in shuffled.describe()
    columnar = Dataset.from_files([path]).load_jsonl().deduplicate(col("k"))
    assert "load_jsonl() [batches] => scatter(hash(col('k'))" in columnar.describe()
    plain = Dataset.from_files([path]).load_jsonl().map(py_identity)
    assert "[batches]" not in plain.describe() and "to_records" not in plain.describe()


def test_block_size_follows_the_memory_budget():
    assert block_bytes(2 * 2**30) == MAX_BLOCK
    assert block_bytes(256 * 2**20) == 4 * 2**20
    assert block_bytes(16 * 2**20) == MIN_BLOCK


def fail_on_late_ids(table: pa.Table) -> pa.Table:
    if max(table.column("id").to_pylist()) >= 2500:
        raise ValueError("an id this function cannot take")
    return table


def py_tag(record):
    return {**record, "tag": 1}


def test_an_error_in_a_batch_op_names_no_wrong_record(tmp_path):
    """Regression: a map_batches error in the second block was blamed on the last record of the
    first block (the rows counted so far), when a per-record op followed."""
    path = _write(tmp_path / "in.jsonl", [orjson.dumps({"id": i, "text": "x" * 1000}) for i in range(3000)])
    assert os.path.getsize(path) > MIN_BLOCK  # two blocks with no memory budget's minimum
    for columnar in ("1", "0"):
        os.environ["ZEPHYR_COLUMNAR"] = columnar
        try:
            ds = Dataset.from_files([path]).load_jsonl().map_batches(fail_on_late_ids).map(py_tag).write_jsonl(str(tmp_path / "o.jsonl"))
            backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s"), memory="16MiB")
            with pytest.raises(Exception, match="an id this function cannot take") as raised:
                list(backend.execute(ds))
        finally:
            os.environ.pop("ZEPHYR_COLUMNAR", None)
        error = raised.value
        while error is not None and not hasattr(error, "record"):
            error = error.__cause__
        assert error is not None and error.record is None, (columnar, error and error.record)


@pytest.mark.ray
def test_on_ray_the_batch_path_writes_the_record_paths_bytes(ray_shared, tmp_path):
    """Ray workers run the batch path (on by default there); the sync record path is the reference."""
    inputs = [_write(tmp_path / f"in-{i}.jsonl", [orjson.dumps({"id": i * 100 + j, "text": "abcde"[j % 5] * (j % 7)}) for j in range(60)])
              for i in range(3)]

    def pipelines(out):
        base = Dataset.from_files(inputs).load_jsonl()
        return [base.deduplicate(col("text"), num_output_shards=2).write_jsonl(out + "/d-{shard}.jsonl.gz"),
                base.with_columns(n=col("text").str_len()).filter(col("n") >= 3).write_jsonl(out + "/w-{shard}.jsonl")]

    ray_out, record_out = str(tmp_path / "ray"), str(tmp_path / "records")
    backend = create_backend("ray", progress=False, scratch_dir=str(tmp_path / "s1"))
    batches = 0
    for ds in pipelines(ray_out):
        execution = backend.execute(ds)
        list(execution)
        batches += execution.counters.get("zephyr/engine_blocks", 0)
    assert batches == 6  # each input file is one block, in both pipelines
    os.environ["ZEPHYR_COLUMNAR"] = "0"
    try:
        for ds in pipelines(record_out):
            list(create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s2")).execute(ds))
    finally:
        os.environ.pop("ZEPHYR_COLUMNAR", None)
    names = sorted(n for n in os.listdir(record_out) if not n.startswith("."))
    assert names == sorted(n for n in os.listdir(ray_out) if not n.startswith(".")) and len(names) == 5
    for name in names:
        assert _read(os.path.join(ray_out, name)) == _read(os.path.join(record_out, name)), name


def first_two(items):
    return [next(items), next(items)]


def test_a_map_shard_after_batches_gets_an_iterator(tmp_path):
    """Regression: after a batch-path op a map_shard function got the stream as a plain
    iterable, so `next(items)` raised TypeError (records give it an iterator)."""
    path = _write(tmp_path / "in.jsonl", [orjson.dumps({"k": i}) for i in range(5)])
    ds = Dataset.from_files([path]).load_jsonl().filter(col("k") > 0).map_shard(first_two)
    backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s"))
    assert "load_jsonl(filter=(col('k') > lit(0))) [batches] -> to_records -> map_shard(first_two)" in ds.describe()
    assert list(backend.execute(ds)) == [{"k": 1}, {"k": 2}]


def text_of(record):
    return str(record.get("text"))


def texts_of_group(key, items):
    return {"key": key, "texts": [item["text"] for item in items]}


def test_a_group_by_with_sort_by_after_batches_orders_its_groups(tmp_path):
    """Regression: Arrow rows reached a scatter with `sort_by` and were buffered without their
    sort values, so groups came out in input order instead of sorted."""
    path = _write(tmp_path / "in.jsonl", [orjson.dumps({"k": i % 2, "text": t}) for i, t in enumerate("dcbahgfe")])
    ds = (Dataset.from_files([path]).load_jsonl().filter(col("k") >= 0)
          .group_by(col("k"), texts_of_group, sort_by=text_of).write_jsonl(str(tmp_path / "o-{shard}.jsonl")))
    list(create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s")).execute(ds))
    got = sorted((json.loads(line) for line in _read(tmp_path / "o-0.jsonl").splitlines()), key=lambda g: g["key"])
    assert got == [{"key": 0, "texts": sorted("dbhf")}, {"key": 1, "texts": sorted("cage")}]


def test_files_of_long_lines_run_in_the_engine(tmp_path):
    """Regression: a file whose lines averaged over 1 KiB was read as records throughout."""
    docs = [orjson.dumps({"id": i, "text": "word " * (300 + i)}) for i in range(20)]
    path = _write(tmp_path / "in.jsonl", docs)
    ds = Dataset.from_files([path]).load_jsonl().filter(col("id") > 4).write_jsonl(str(tmp_path / "o.jsonl"))
    execution = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s")).execute(ds)
    list(execution)
    assert execution.counters.get("zephyr/engine_blocks", 0) == 1
    assert execution.counters.get("zephyr/python_expressions", 0) == 0
    assert _read(tmp_path / "o.jsonl") == b"".join(d + b"\n" for d in docs[5:])


def test_parquet_from_batches_cuts_and_widens_row_groups_as_the_record_path(tmp_path):
    """20,000 rows in ~1 MiB blocks, so the writer's 8,192-row batches straddle blocks; a
    column that is null for the first 9,000 rows widens the schema in the second batch. The
    batch path writes the record path's bytes without turning a batch into records, and the
    file reads back as plain Python says."""
    import pyarrow.parquet as pq

    rows = [{"id": i, "t": "é" * (i % 7), "b": i % 3 == 0, "n": None if i < 9000 else f"s{i}", "pad": "p" * 120} for i in range(20000)]
    source = _write(tmp_path / "in.jsonl", [orjson.dumps(r) for r in rows])
    outputs = {}
    for columnar in (False, True):
        out = tmp_path / f"out-{columnar}"
        os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
        try:
            backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / f"scratch-{columnar}"), memory="64MiB")
            ds = Dataset.from_files([source]).load_jsonl().filter(col("id") >= 5).write_parquet(str(out / "p-{shard:03d}.parquet"))
            execution = backend.execute(ds)
            list(execution)
            backend.close()
        finally:
            os.environ.pop("ZEPHYR_COLUMNAR", None)
        outputs[columnar] = _read(out / "p-000.parquet")
        if columnar:
            assert execution.counters.get("zephyr/engine_blocks", 0) >= 3  # the batches straddled blocks
            assert execution.counters.get("zephyr/parquet_batches_as_records", 0) == 0
            assert "write_parquet" in ds.describe() and "to_records" not in ds.describe()
    assert outputs[True] == outputs[False]
    written = pq.ParquetFile(tmp_path / "out-True" / "p-000.parquet")
    assert [written.metadata.row_group(i).num_rows for i in range(written.num_row_groups)] == [8192, 8192, 20000 - 5 - 2 * 8192]
    assert written.read().to_pylist() == [r for r in rows if r["id"] >= 5]


@settings(max_examples=100, deadline=None)
@given(records=st.lists(st.fixed_dictionaries({}, optional={"k": st.one_of(st.none(), st.integers(-5, 5)), "s": st.one_of(st.none(), texts),
                                                              "b": st.booleans()}), min_size=1, max_size=12))
def test_a_table_made_from_records_drops_no_field(records):
    """Regression: `map_batches` on records built its table with `Table.from_pylist`, which
    takes the first record's keys, so a field the first record lacked vanished. Every key any
    record has is a column; each row reads back as its record plus nulls for the keys it lacks."""
    from zephyr.execution.engine_ops import records_table

    table = records_table(records)
    names = list(dict.fromkeys(k for r in records for k in r))
    assert table.column_names == names and (table.num_rows == len(records) or not names)
    if names:
        assert table.to_pylist() == [{k: r.get(k) for k in names} for r in records]


@pytest.mark.parametrize("on_bad_record", ["raise", "skip"])
def test_json_lines_that_are_not_utf8_are_bad_records_on_both_paths(tmp_path, on_bad_record):
    """Regression: pyarrow's JSON reader takes strings (and keys) that are not UTF-8, and such a
    block wrote itself back byte for byte, so the batch path copied the bytes into its output
    where the record path raises BadRecordError naming the line (or skips and counts it)."""
    source = _write(tmp_path / "in.jsonl", [b'{"k":1,"s":"ok"}', b'{"k":2,"s":"\xff\xfe"}', b'{"k":3,"s":"\xed\xa0\x80"}',
                                             b'{"\xff":4,"s":"x"}', b'{"k":5,"s":"fine"}'])
    outputs = {}
    for columnar in (False, True):
        os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
        backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "scratch"))
        out = tmp_path / f"out-{columnar}"
        ds = Dataset.from_files([source]).load_jsonl(on_bad_record=on_bad_record).filter(col("k") > 0).write_jsonl(str(out / "o.jsonl"))
        try:
            if on_bad_record == "raise":
                with pytest.raises(ShardError, match=r"in.jsonl:2: malformed JSON: str is not valid UTF-8"):
                    list(backend.execute(ds))
                assert not (out / "o.jsonl").exists()
                continue
            execution = backend.execute(ds)
            list(execution)
        finally:
            backend.close()
            os.environ.pop("ZEPHYR_COLUMNAR", None)
        assert execution.counters.get("zephyr/bad_records") == 3
        outputs[columnar] = _read(out / "o.jsonl")
    if on_bad_record == "skip":
        assert outputs[True] == outputs[False] == b'{"k":1,"s":"ok"}\n{"k":5,"s":"fine"}\n'


def test_the_summary_says_what_ran_in_python_and_why(tmp_path):
    """No silent fallback: a column of several kinds is named in the end-of-run summary."""
    from zephyr.execution.summary import format_summary

    path = _write(tmp_path / "in.jsonl", [b'{"score":1}', b'{"score":"high"}', b'{"score":0.5}'])
    ds = Dataset.from_files([path]).load_jsonl().filter(col("score").is_not_null()).write_jsonl(str(tmp_path / "o.jsonl"))
    execution = create_backend("sync", progress=False, scratch_dir=str(tmp_path / "s")).execute(ds)
    list(execution)
    summary = format_summary(execution)
    assert "column 'score' held values of several kinds" in summary and "in 1 block(s)" in summary
    assert execution.counters["zephyr/python_columns/score"] == 1
