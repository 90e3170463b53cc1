"""Readers and writers with the reference project's names (issue 25): Vortex files, the plain
loaders (`zephyr.readers.load_file`, ...) with `InputFileSpec`, the one-file writers of
`zephyr.writers`, `load_parquet(batch_mode=True)`, `from_files(directory, pattern)`, the
select that would drop the file path column, and expressions as set members. Every expected
value is computed here in plain Python from the records written."""

import dataclasses
import json
import sys

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from ray import cloudpickle

from zephyr import Dataset, col, lit
from zephyr.readers import DEFAULT_FILE_PATH_COLUMN, InputFileSpec, load_file, load_jsonl, load_parquet, load_vortex
from zephyr.writers import write_jsonl_file, write_parquet_file, write_vortex_file

cloudpickle.register_pickle_by_value(sys.modules[__name__])  # Ray workers cannot import this file (Doc)

ROWS = [{"id": i, "name": f"item_{i}", "score": i * 10, "ratio": i / 4, "tag": None if i % 3 else "x"} for i in range(100)]


@dataclasses.dataclass
class Doc:
    name: str
    value: int


@pytest.fixture
def mixed_dir(tmp_path):
    """One file per format, 10 rows each, ids 0-29 in file-name order."""
    directory = tmp_path / "in"
    directory.mkdir()
    write_jsonl_file(ROWS[0:10], str(directory / "a.jsonl.gz"))
    write_parquet_file(ROWS[10:20], str(directory / "b.parquet"))
    write_vortex_file(ROWS[20:30], str(directory / "c.vortex"))
    return directory


# ---- Vortex ----------------------------------------------------------------------------------


def test_vortex_file_round_trip_and_writer_result(tmp_path):
    path = str(tmp_path / "t.vortex")
    assert write_vortex_file(ROWS, path) == {"path": path, "count": 100}
    assert list(load_vortex(path)) == ROWS


def test_vortex_empty_file_reads_nothing_even_with_columns(tmp_path):
    path = str(tmp_path / "empty.vortex")
    assert write_vortex_file([], path)["count"] == 0
    assert list(load_vortex(path)) == []
    assert list(load_vortex(InputFileSpec(path, columns=["id", "attributes"]))) == []


def test_vortex_on_an_object_store_path():
    path = "memory://compat-io/vortex/t.vortex"
    write_vortex_file(ROWS[:7], path)
    assert list(load_vortex(path)) == ROWS[:7]


# predicates as (expression, the same condition in plain Python); None compares as SQL null
_LEAVES = [
    (col("score") > 500, lambda r: r["score"] is not None and r["score"] > 500),
    (col("score") <= 120, lambda r: r["score"] is not None and r["score"] <= 120),
    (col("ratio") == 2.5, lambda r: r["ratio"] is not None and r["ratio"] == 2.5),
    (col("id") != 7, lambda r: r["id"] is not None and r["id"] != 7),
    (col("tag") == "x", lambda r: r["tag"] == "x"),
    (col("tag").is_null(), lambda r: r["tag"] is None),
    (col("ratio") * 2.0 > 30, lambda r: r["ratio"] is not None and r["ratio"] * 2.0 > 30),
]


@st.composite
def predicates(draw):
    """A random chain of & and | over the leaves, with its plain-Python twin. Without a negation
    above a comparison, a null comparison acts as false in three-valued logic too, which is
    what each leaf's twin says."""
    expr, check = _LEAVES[draw(st.integers(0, len(_LEAVES) - 1))]
    for _ in range(draw(st.integers(0, 3))):
        other, other_check = _LEAVES[draw(st.integers(0, len(_LEAVES) - 1))]
        how = draw(st.sampled_from(["&", "|"]))
        if how == "&":
            expr, check = expr & other, (lambda a, b: lambda r: a(r) and b(r))(check, other_check)
        else:
            expr, check = expr | other, (lambda a, b: lambda r: a(r) or b(r))(check, other_check)
    return expr, check


@pytest.fixture(scope="module")
def nullable_vortex(tmp_path_factory):
    """ROWS with nulls in every filtered column, so pushdown meets null handling."""
    rows = [{**r, "score": None if r["id"] % 7 == 0 else r["score"], "ratio": None if r["id"] % 5 == 0 else r["ratio"]}
            for r in ROWS]
    path = str(tmp_path_factory.mktemp("vortex") / "nullable.vortex")
    write_vortex_file(rows, path)
    return path, rows


@settings(max_examples=25, deadline=None)
@given(predicates(), st.sampled_from([None, ["id"], ["name", "id"]]))
def test_vortex_filter_and_columns_give_what_python_gives(nullable_vortex, predicate, columns):
    """Pushdown into Vortex (and the rows Python filters where it does not push) keep exactly
    the rows the plain-Python condition keeps."""
    path, rows = nullable_vortex
    expr, check = predicate
    expected = [r if columns is None else {c: r[c] for c in columns} for r in rows if check(r)]
    assert list(load_vortex(InputFileSpec(path, columns=columns, filter_expr=expr))) == expected


def test_vortex_row_range_comes_before_the_filter(tmp_path):
    path = str(tmp_path / "t.vortex")
    write_vortex_file(ROWS, path)
    got = list(load_vortex(InputFileSpec(path, columns=["id"], row_start=10, row_end=60, filter_expr=col("score") >= 300)))
    assert got == [{"id": r["id"]} for r in ROWS[10:60] if r["score"] >= 300]


def test_vortex_pipeline_read_filter_select_write(backend, tmp_path):
    source = tmp_path / "in.vortex"
    write_vortex_file(ROWS, str(source))
    pipeline = (Dataset.from_files(str(source)).load_vortex().filter(col("score") > 500).select("id", "score")
                .write_vortex(str(tmp_path / "out-{shard:05d}.vortex")))
    [written] = list(backend.execute(pipeline))
    assert list(load_vortex(written)) == [{"id": r["id"], "score": r["score"]} for r in ROWS if r["score"] > 500]
    plan = Dataset.from_files(str(source)).load_vortex().filter(col("score") > 500).select("id").describe()
    assert "load_vortex(columns=['id'], filter=(col('score') > lit(500)))" in plan  # folded into the reader


def test_vortex_and_parquet_convert_both_ways(backend, tmp_path):
    parquet = tmp_path / "in.parquet"
    write_parquet_file(ROWS, str(parquet))
    [vortex] = list(backend.execute(Dataset.from_files(str(parquet)).load_parquet().write_vortex(str(tmp_path / "v-{shard}.vortex"))))
    assert list(load_vortex(vortex)) == ROWS
    [back] = list(backend.execute(Dataset.from_files(vortex).load_file().write_parquet(str(tmp_path / "p-{shard}.parquet"))))
    assert list(load_parquet(back)) == ROWS


VORTEX_FLOAT_FILTERS = [col("f") > 1.0, col("f") >= 1.5, col("f") == 0.0, col("f") != 1.5, lit(1.0) < col("f"),
                        (col("f") > 1.0) & (col("i") > 0)]


def test_vortex_filters_on_floats_and_beside_structs_agree_with_python(local_backend, tmp_path):
    """Regression: float comparisons went into Vortex, which orders floats totally (NaN above
    every number, -0.0 apart from 0.0): `f > 1.0` kept NaN rows, `f == 0.0` lost -0.0. And a
    filter on a column after a struct column failed the shard ("Couldn't find the y field")."""
    from zephyr.writers import write_vortex_file as write

    rows = [{"i": i, "f": f, "s": {"y": i}, "b": i + 3} for i, f in enumerate([float("nan"), 1.5, -0.0, 2.0, 0.5])]
    path = str(tmp_path / "f.vortex")
    write(rows, path)
    for expr in [*VORTEX_FLOAT_FILTERS, col("b") > 5]:
        got = list(local_backend.execute(Dataset.from_files(path).load_vortex().filter(expr)))
        assert [r["i"] for r in got] == [r["i"] for r in rows if expr(r)], expr


def test_a_select_naming_the_file_path_column_after_projected_loads_keeps_it(local_backend, tmp_path):
    """Regression: load_parquet(columns=[...], include_file_paths=True).select(..., the path column)
    raised DroppedPathColumnError though the select names the column."""
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), path)
    ds = Dataset.from_list([path]).load_parquet(columns=["id"], include_file_paths=True).select("id", DEFAULT_FILE_PATH_COLUMN)
    assert list(local_backend.execute(ds)) == [{"id": r["id"], DEFAULT_FILE_PATH_COLUMN: path} for r in ROWS[:2]]


def test_load_vortex_with_file_paths(local_backend, tmp_path):
    path = str(tmp_path / "t.vortex")
    write_vortex_file(ROWS[:3], path)
    got = list(local_backend.execute(Dataset.from_files(path).load_vortex(columns=["id"], include_file_paths=True)))
    assert got == [{"id": r["id"], DEFAULT_FILE_PATH_COLUMN: path} for r in ROWS[:3]]


# ---- plain loaders in flat_map, InputFileSpec, from_files(directory, pattern) -----------------


def test_load_file_in_flat_map_reads_every_format(backend, mixed_dir):
    got = list(backend.execute(Dataset.from_files(str(mixed_dir), "*").flat_map(load_file)))
    assert got == ROWS[:30]  # one shard per file, in name order


def test_load_file_refuses_an_unknown_extension(local_backend, mixed_dir):
    (mixed_dir / "notes.txt").write_text("hello")
    with pytest.raises(Exception, match="Unsupported"):
        list(local_backend.execute(Dataset.from_files(str(mixed_dir), "*.txt").flat_map(load_file)))


def test_from_files_directory_and_pattern(local_backend, mixed_dir):
    assert [p.rsplit("/", 1)[-1] for p in local_backend.execute(Dataset.from_files(str(mixed_dir), "*.parquet"))] == ["b.parquet"]
    with pytest.raises(FileNotFoundError, match="matched no files"):
        list(local_backend.execute(Dataset.from_files(str(mixed_dir), "*.csv")))
    assert list(local_backend.execute(Dataset.from_files(str(mixed_dir), "*.csv", True))) == []


@settings(max_examples=30, deadline=None)
@given(st.integers(0, 40), st.integers(0, 40), st.sampled_from([None, ["id"], ["score", "id"]]), st.booleans())
def test_input_file_spec_range_filter_columns_every_format(mixed_dir, start, length, columns, filtered):
    """Rows [start, start+length) of each file, then the filter, then the columns; as slicing
    the written rows in Python."""
    end = start + length
    expr = (col("score") >= 150) if filtered else None
    for name, rows in (("a.jsonl.gz", ROWS[0:10]), ("b.parquet", ROWS[10:20]), ("c.vortex", ROWS[20:30])):
        spec = InputFileSpec(str(mixed_dir / name), columns=columns, row_start=start, row_end=end, filter_expr=expr)
        kept = [r for r in rows[start:end] if not filtered or r["score"] >= 150]
        assert list(load_file(spec)) == [r if columns is None else {c: r[c] for c in columns} for r in kept], name


def test_parquet_row_range_across_row_groups(tmp_path):
    path = str(tmp_path / "groups.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=7)
    assert [r["id"] for r in load_parquet(InputFileSpec(path, row_start=5, row_end=23))] == list(range(5, 23))
    assert list(load_parquet(InputFileSpec(path, row_start=99, row_end=100, columns=["name"]))) == [{"name": "item_99"}]


def test_input_file_spec_items_in_a_pipeline(backend, mixed_dir):
    specs = [InputFileSpec(str(mixed_dir / "b.parquet"), row_start=2, row_end=5),
             InputFileSpec(str(mixed_dir / "a.jsonl.gz"), columns=["id"])]
    got = list(backend.execute(Dataset.from_list(specs).load_file()))
    assert got == ROWS[12:15] + [{"id": r["id"]} for r in ROWS[0:10]]


def test_input_file_spec_rejects_bad_values():
    with pytest.raises(ValueError, match="format must be one of"):
        InputFileSpec("a.csv", format="csv")
    with pytest.raises(ValueError, match="row_end .* is before row_start"):
        InputFileSpec("a.parquet", row_start=5, row_end=2)


def test_load_parquet_reads_without_pyarrow_dataset(tmp_path, monkeypatch):
    """The plain loader and batch mode never import pyarrow.dataset (the reference avoids it:
    it leaks memory, arrow issue 39808)."""
    path = str(tmp_path / "t.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=30)
    monkeypatch.delitem(sys.modules, "pyarrow.dataset", raising=False)
    monkeypatch.setitem(sys.modules, "pyarrow.dataset", None)  # any import of it now fails
    assert list(load_parquet(path)) == ROWS
    spec = InputFileSpec(path, columns=["id"], row_start=3, row_end=90, filter_expr=col("score") > 400)
    assert list(load_parquet(spec)) == [{"id": r["id"]} for r in ROWS[3:90] if r["score"] > 400]


def test_load_jsonl_plain_function(tmp_path):
    path = str(tmp_path / "t.jsonl")
    with open(path, "w") as f:
        f.writelines(json.dumps(r) + "\n" for r in ROWS[:5])
    assert list(load_jsonl(path)) == ROWS[:5]


# ---- writers ------------------------------------------------------------------------------------


def test_one_file_writers_return_path_and_count(tmp_path):
    for name, write in (("a.jsonl.zst", write_jsonl_file), ("b.parquet", write_parquet_file), ("c.vortex", write_vortex_file)):
        path = str(tmp_path / name)
        assert write(iter(ROWS[:4]), path) == {"path": path, "count": 4}
        assert list(load_file(path)) == ROWS[:4]


def test_write_parquet_of_dataclasses(backend, tmp_path):
    docs = [Doc("alpha", 100), Doc("beta", 200), Doc("gamma", 300)]
    written = list(backend.execute(Dataset.from_list(docs).write_parquet(str(tmp_path / "d-{shard:05d}.parquet"))))
    got = [r for path in written for r in load_parquet(path)]
    assert got == [{"name": d.name, "value": d.value} for d in docs]


# ---- batch mode -----------------------------------------------------------------------------


def test_load_parquet_batch_mode_yields_record_batches(backend, tmp_path):
    paths = [str(tmp_path / "a.parquet"), str(tmp_path / "b.parquet")]
    pq.write_table(pa.Table.from_pylist(ROWS[:6]), paths[0], row_group_size=2)
    pq.write_table(pa.Table.from_pylist(ROWS[6:9]), paths[1])
    ds = Dataset.from_list(paths).load_parquet(include_file_paths=True, file_path_column="source", batch_mode=True)
    batches = list(backend.execute(ds))
    assert all(isinstance(b, pa.RecordBatch) for b in batches) and len(batches) == 4  # one per row group
    assert all(b.schema.field("source").type == pa.string() for b in batches)
    rows = [r for b in batches for r in b.to_pylist()]
    assert rows == [{**r, "source": paths[0]} for r in ROWS[:6]] + [{**r, "source": paths[1]} for r in ROWS[6:9]]


def test_batch_mode_takes_a_folded_select_and_filter(local_backend, tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=25)
    ds = Dataset.from_list([path]).load_parquet(batch_mode=True).filter(col("score") >= 400).select("name", "id")
    rows = [r for b in local_backend.execute(ds) for r in b.to_pylist()]
    assert rows == [{"name": r["name"], "id": r["id"]} for r in ROWS if r["score"] >= 400]


# ---- select without the file path column; expressions ------------------------------------------------


def test_select_that_drops_the_file_path_column_raises(local_backend, tmp_path):
    path = str(tmp_path / "a.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS[:2]), path)
    ds = Dataset.from_list([path]).load_parquet(include_file_paths=True).select("id")
    with pytest.raises(RuntimeError, match=f"Column filter must include file path column '{DEFAULT_FILE_PATH_COLUMN}'"):
        list(local_backend.execute(ds))
    kept = Dataset.from_list([path]).load_parquet(include_file_paths=True).select("id", DEFAULT_FILE_PATH_COLUMN)
    assert list(local_backend.execute(kept)) == [{"id": r["id"], DEFAULT_FILE_PATH_COLUMN: path} for r in ROWS[:2]]


def test_expression_reprs_name_literals():
    assert repr(lit(42)) == "lit(42)" and repr(lit("hello")) == "lit('hello')"
    assert repr(col("score") > 50) == "(col('score') > lit(50))"
    assert repr(~(col("flag") == True)) == "~((col('flag') == lit(True)))"  # noqa: E712
    assert repr((col("a") > 0) & (col("b") > 0)) == "((col('a') > lit(0)) & (col('b') > lit(0)))"


def test_expressions_are_set_members_and_dict_keys():
    built = {col("score") > 0.5: "a", (col("x") == 1) | col("y").is_null(): "b"}
    assert built[col("score") > 0.5] == "a" and built[(col("x") == 1) | col("y").is_null()] == "b"
    assert (col("score") > 0.5) in {col("score") > 0.5}
    assert (col("score") > 0.6) not in {col("score") > 0.5}
    assert (col("score") > 1) not in {col("score") > 1.0, col("score") > True}  # 1, 1.0 and True are three literals
    eq = col("a") == 1
    assert eq.evaluate({"a": 1}) is True  # == still builds an expression
    with pytest.raises(TypeError, match="truth value"):
        bool(eq)  # and a truth test of it is still refused (`and`/`or` misuse)


def test_reference_expression_class_names():
    from zephyr.expr import ColumnExpr, CompareExpr, LiteralExpr, to_pyarrow_expr

    expr = CompareExpr(op="ge", left=ColumnExpr(name="score"), right=LiteralExpr(value=50.0))
    assert repr(expr) == repr(col("score") >= 50.0)
    assert [r["score"] for r in ROWS if expr(r)] == [r["score"] for r in ROWS if r["score"] >= 50.0]
    table = pa.Table.from_pylist(ROWS)
    assert table.filter(to_pyarrow_expr(expr)).column("id").to_pylist() == [r["id"] for r in ROWS if r["score"] >= 50]
    with pytest.raises(ValueError, match="op must be one of"):
        CompareExpr(col("a"), lit(1), "like")


def test_iter_parquet_row_groups_equality_predicates(tmp_path):
    """Row groups are tables; only rows equal to every predicate value, the predicate columns
    read for that and dropped unless asked for."""
    from zephyr.readers import iter_parquet_row_groups

    path = str(tmp_path / "scatter.parquet")
    rows = [{"shard": s, "chunk": c, "item": f"{s}-{c}-{i}"} for s in range(3) for c in range(2) for i in range(3)]
    with pq.ParquetWriter(path, pa.Table.from_pylist(rows[:1]).schema) as writer:
        for start in range(0, len(rows), 3):  # one row group per (shard, chunk)
            writer.write_table(pa.Table.from_pylist(rows[start:start + 3]))
    tables = list(iter_parquet_row_groups(path, columns=["item"], equality_predicates={"shard": 1, "chunk": 1}))
    assert [t.column_names for t in tables] == [["item"]]
    assert tables[0].column("item").to_pylist() == [r["item"] for r in rows if r["shard"] == 1 and r["chunk"] == 1]
    assert list(iter_parquet_row_groups(path, equality_predicates={"shard": 9})) == []
    mixed = [t.to_pylist() for t in iter_parquet_row_groups(pq.ParquetFile(path), row_start=4, row_end=10)]
    assert [r for t in mixed for r in t] == rows[4:10]


def test_type_conflict_is_an_arrow_invalid_naming_record_and_field(tmp_path):
    """What the reference's writers raise (pyarrow.ArrowInvalid), and still ours (the record, the field)."""
    from zephyr import UnwritableRecordError

    rows = [{"x": i} for i in range(8)] + [{"x": "stringy"}]
    with pytest.raises(pa.ArrowInvalid, match=r"record 8, field 'x': .*int.*string") as caught:
        write_parquet_file(rows, str(tmp_path / "t.parquet"))
    assert isinstance(caught.value, UnwritableRecordError) and isinstance(caught.value, ValueError)
    assert not (tmp_path / "t.parquet").exists()


def test_infer_arrow_schema():
    from zephyr.writers import infer_arrow_schema

    schema = infer_arrow_schema([{"id": 1, "score": None, "none": None, "meta": {"k": "v"}}, {"id": 2, "score": 1.5, "none": None}])
    assert schema == pa.schema([("id", pa.int64()), ("score", pa.float64()), ("none", pa.null()),
                                ("meta", pa.struct([("k", pa.string())]))])
    with pytest.raises(pa.ArrowInvalid, match="'foo'"):
        infer_arrow_schema([{"foo": 1.5}, {"foo": "bar"}])


def test_map_batches_on_dict_records_hands_tables_of_batch_size_and_returns_records(local_backend):
    """Dict records go to `fn` as pyarrow Tables of at most `batch_size` rows; its rows come back as records."""
    sizes = []

    def double_ids(table):
        import pyarrow.compute as pc

        sizes.append(table.num_rows)
        return table.set_column(0, "id", pc.multiply(table.column("id"), 2))

    rows = [{"id": i, "s": str(i)} for i in range(10)]
    out = list(local_backend.execute(Dataset.from_list([rows]).flat_map(list).map_batches(double_ids, batch_size=4)))
    assert out == [{"id": 2 * r["id"], "s": r["s"]} for r in rows]
    assert sizes == [4, 4, 2]


def _keep_big_and_double(batch):
    import pyarrow.compute as pc

    kept = batch.filter(pc.greater_equal(batch.column("score"), 700))
    return kept.append_column("double", pc.multiply(kept.column("id"), 2))


def test_map_batches_from_batch_mode_to_a_parquet_writer(backend, tmp_path):
    path = str(tmp_path / "in.parquet")
    pq.write_table(pa.Table.from_pylist(ROWS), path, row_group_size=30)  # the first groups keep no row
    ds = (Dataset.from_list([path]).load_parquet(columns=["id", "score"], batch_mode=True).map_batches(_keep_big_and_double)
          .write_parquet(str(tmp_path / "out-{shard}.parquet")))
    [written] = list(backend.execute(ds))
    assert list(load_parquet(written)) == [{"id": r["id"], "score": r["score"], "double": 2 * r["id"]} for r in ROWS if r["score"] >= 700]


def test_map_batches_refuses_other_items_and_non_batch_results(local_backend):
    with pytest.raises(Exception, match="map_batches needs dict records or pyarrow.RecordBatch items"):
        list(local_backend.execute(Dataset.from_list([1, 2]).map_batches(lambda b: b)))
    batch = pa.RecordBatch.from_pylist([{"id": 1}])
    with pytest.raises(Exception, match="must return a pyarrow.RecordBatch, got list"):
        list(local_backend.execute(Dataset.from_list([batch]).map_batches(lambda b: b.to_pylist())))
