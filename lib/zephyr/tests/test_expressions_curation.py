"""Expressions for curation (string functions, `is_in`, `cast`, `list_len`, `hash`, `when`):
the same records on the record path (`ZEPHYR_COLUMNAR=0`) and in the engine, both equal to a
plain-Python oracle written here apart from `zephyr.expr.functions`; the same error where a
value is of a kind the function does not take; and which of them Polars computes natively
(`zephyr.engine.translate`, `zephyr.engine.calls`, `zephyr.engine.patterns`)."""

from __future__ import annotations

import json
import math
import os
import pickle
import re
import subprocess
import sys
import tempfile
from typing import Any

import orjson
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import xxhash
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from zephyr import Dataset, col, create_backend, lit, when
from zephyr.engine.calls import python_whitespace
from zephyr.engine.patterns import polars_reads_alike
from zephyr.engine.translate import to_polars, to_polars_filter
from zephyr.errors import ShardError

# ---------------------------------------------------------------- generated values

WHITESPACE = " \t\n\x0b\x0c\r\x1c\x1d\x1e\x1f\x85\xa0\u1680\u2000\u2007\u200a\u2028\u2029\u202f\u205f\u3000"
NOT_WHITESPACE = "\u200b\u180e\ufeff\x00"  # zero-width space, Mongolian vowel separator, BOM, NUL
TRICKY = ["ΑΣ", "Σ", "ß", "İ", "ǅ", "ŉ", "\U00010d50", "\u019b", "\ua7cb", "𝒳", "é", "e\u0301", "ﬃ", "Ⅻ", "Ａ"]
pieces = st.one_of(
    st.text(st.characters(codec="utf-8", exclude_categories=["Cs"]), max_size=4),
    st.sampled_from(list(WHITESPACE) + list(NOT_WHITESPACE) + TRICKY + ["a", "B", "ab", "x1", "-", "."]),
)
strings = st.lists(pieces, max_size=6).map("".join)
PATTERNS = ["", "a", "^a", "a.b", "[a-c]+", "[^ ]+ [^ ]+", "(ab|x1)", "ΑΣ", "\\.", "a{2}", "[\\-.]", "a*?b",  # read alike
            "\\w+", "\\d", "\\s", "a$", "(?i)ab", "(?=a)", "\\bx", "[[:alpha:]]"]  # left to Python


def oracle_strip(s: str) -> str:
    start, end = 0, len(s)
    while start < end and s[start].isspace():
        start += 1
    while end > start and s[end - 1].isspace():
        end -= 1
    return s[start:end]


def oracle_word_count(s: str) -> int:
    words, inside = 0, False
    for c in s:
        if not c.isspace() and not inside:
            words += 1
        inside = not c.isspace()
    return words


def oracle_hash(value: Any) -> int:
    """xxHash64 of the shuffle's key bytes, spelled out for the kinds a test writes."""
    if isinstance(value, str):
        data = b"s" + value.encode("utf-8")
    elif isinstance(value, bool):
        data = b"jtrue" if value else b"jfalse"
    else:
        data = b"j" + str(value).encode()
    return xxhash.xxh64_intdigest(data)


STRING_FUNCTIONS = {  # name -> (expression of col("s"), oracle of a str); given (sub, pattern, values)
    "lower": (lambda a: col("s").str_lower(), lambda s, a: s.lower()),
    "upper": (lambda a: col("s").str_upper(), lambda s, a: s.upper()),
    "strip": (lambda a: col("s").str_strip(), lambda s, a: oracle_strip(s)),
    "words": (lambda a: col("s").word_count(), lambda s, a: oracle_word_count(s)),
    "len": (lambda a: col("s").str_len(), lambda s, a: len(s)),
    "contains": (lambda a: col("s").str_contains(a[0]), lambda s, a: s.find(a[0]) >= 0),
    "starts": (lambda a: col("s").str_starts_with(a[0]), lambda s, a: s[: len(a[0])] == a[0]),
    "ends": (lambda a: col("s").str_ends_with(a[0]), lambda s, a: len(a[0]) <= len(s) and s[len(s) - len(a[0]) :] == a[0]),
    "matches": (lambda a: col("s").str_matches(a[1]), lambda s, a: re.search(a[1], s) is not None),
    "hash": (lambda a: col("s").hash(), lambda s, a: oracle_hash(s)),
    "in": (lambda a: col("s").is_in(a[2]), lambda s, a: any(s == v for v in a[2])),
    "as str": (lambda a: col("s").cast("str"), lambda s, a: s),
}


# ---------------------------------------------------------------- running both paths

def run(columnar: bool, lines: list[bytes], build, work: str) -> tuple[list | None, str | None, dict]:
    """(records read back, or None; the error's cause as "Type: message", or None; counters)."""
    name = "engine" if columnar else "records"
    path = os.path.join(work, "in.jsonl")
    with open(path, "wb") as f:
        f.write(b"".join(line + b"\n" for line in lines))
    out = os.path.join(work, name)
    os.environ["ZEPHYR_COLUMNAR"] = "1" if columnar else "0"
    try:
        with tempfile.TemporaryDirectory(prefix="zephyr-curation-") as scratch:
            backend = create_backend("sync", progress=False, scratch_dir=scratch)
            try:
                execution = backend.execute(build(Dataset.from_files([path]).load_jsonl()).write_jsonl(out + "/o-{shard:03d}.jsonl"))
                list(execution)
            except ShardError as e:
                return None, f"{type(e.__cause__).__name__}: {e.__cause__}", {}
            finally:
                backend.close()
    finally:
        os.environ.pop("ZEPHYR_COLUMNAR", None)
    records = [json.loads(line) for n in sorted(os.listdir(out)) if not n.startswith(".")
               for line in open(os.path.join(out, n), "rb").read().splitlines()]
    return records, None, dict(execution.counters)


def both(lines: list[bytes], build) -> tuple[list | None, str | None, dict]:
    """The record path's result, checked equal to the engine's; and the engine's counters."""
    with tempfile.TemporaryDirectory(prefix="zephyr-curation-case-") as work:
        records, error, _ = run(False, lines, build, work)
        engine, engine_error, counters = run(True, lines, build, work)
    assert engine_error == error
    assert engine == records
    return records, error, counters


def jsonl(records: list[dict]) -> list[bytes]:
    return [orjson.dumps(r) for r in records]


def same(a: Any, b: Any) -> bool:
    """Equal values of the same JSON type (1 is not 1.0 nor True)."""
    return json.dumps(a) == json.dumps(b)


# ---------------------------------------------------------------- strings, both paths, oracle

@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(values=st.lists(st.one_of(strings, st.none(), st.just("missing")), min_size=1, max_size=12),
       sub=st.one_of(pieces, st.sampled_from(["", ".", "a.", "(", "[", "\\", "^a", "*", "$"])), pattern=st.sampled_from(PATTERNS),
       members=st.lists(st.one_of(pieces, strings), max_size=4), keep=st.sampled_from(sorted(STRING_FUNCTIONS)))
def test_string_functions_match_the_oracle_on_both_paths(values, sub, pattern, members, keep):
    """Every string function at once on a column of strings and nulls (and rows without it):
    each output value is the oracle's; a filter on the boolean ones keeps the oracle's rows."""
    args = (sub, pattern, members)
    records = [{"i": i} if v == "missing" else {"i": i, "s": v} for i, v in enumerate(values)]
    exprs = {f"v_{name}": make(args) for name, (make, _) in STRING_FUNCTIONS.items()}
    out, error, counters = both(jsonl(records), lambda ds: ds.with_columns(**exprs))
    assert error is None
    for record, got in zip(records, out, strict=True):
        for name, (_, oracle) in STRING_FUNCTIONS.items():
            expected = None if record.get("s") is None else oracle(record["s"], args)
            assert same(got[f"v_{name}"], expected), (name, record, got[f"v_{name}"], expected)
    if polars_reads_alike(pattern) and any(isinstance(r.get("s"), str) for r in records):
        # all but str_lower and str_upper computed by Polars (one block)
        assert counters["zephyr/engine_blocks"] == 1 and counters["zephyr/python_expressions"] == 2
    condition = STRING_FUNCTIONS[keep][0](args)
    if keep in ("contains", "starts", "ends", "matches", "in"):
        kept, error, _ = both(jsonl(records), lambda ds: ds.filter(condition))
        assert error is None and [r["i"] for r in kept] == [r["i"] for r in records if r.get("s") is not None
                                                            and STRING_FUNCTIONS[keep][1](r["s"], args)]


# ---------------------------------------------------------------- values of every kind

int64s = st.one_of(st.integers(-5, 5), st.integers(-(2**63), 2**63 - 1))
floats = st.one_of(st.floats(allow_nan=False, allow_infinity=False), st.sampled_from([0.0, -0.0, 1e-07, 0.1 + 0.2, 3.5, 1e16]))
numeric_strings = st.sampled_from(["3", " 42 ", "1_000", "-7", "3.5", "nan", "1e5", "x", "", "\u0663", "True"])
KINDS = {  # a column of one of these is typed in the engine; "mixed" is held in Python
    "bool": st.booleans(), "int": int64s, "float": floats, "str": st.one_of(numeric_strings, strings),
    "mixed": st.one_of(st.booleans(), int64s, st.integers(2**63, 2**70), floats, numeric_strings, strings),
}
columns = st.sampled_from(sorted(KINDS)).flatmap(lambda kind: st.lists(st.one_of(st.none(), KINDS[kind]), min_size=1, max_size=8))


def oracle_cast(value: Any, kind: str) -> Any:
    """Python's conversions, on the kinds each cast takes (else the record path's TypeError)."""
    takes = {"str": (str, int, float, bool), "int": (int, bool, float, str), "float": (float, int, bool, str), "bool": (bool, int, float)}
    if not isinstance(value, takes[kind]):
        raise TypeError
    return {"str": str, "int": int, "float": float, "bool": bool}[kind](value)


def oracle_is_in(value: Any, members: list) -> bool:
    return any(value == m for m in members) if isinstance(value, (bool, int, float, str)) else False


VALUE_FUNCTIONS = {
    "cast str": (lambda m: col("x").cast("str"), lambda v, m: oracle_cast(v, "str")),
    "cast int": (lambda m: col("x").cast("int"), lambda v, m: oracle_cast(v, "int")),
    "cast float": (lambda m: col("x").cast("float"), lambda v, m: oracle_cast(v, "float")),
    "cast bool": (lambda m: col("x").cast("bool"), lambda v, m: oracle_cast(v, "bool")),
    "is_in": (lambda m: col("x").is_in(m), lambda v, m: oracle_is_in(v, m)),
    "hash": (lambda m: col("x").hash(), lambda v, m: oracle_hash(v) if not isinstance(v, float) else None),
    "list_len": (lambda m: col("x").list_len(), lambda v, m: len(v) if isinstance(v, list) else _raise(TypeError)),
    "words": (lambda m: col("x").word_count(), lambda v, m: oracle_word_count(v) if isinstance(v, str) else _raise(TypeError)),
    "when": (lambda m: when(col("x").is_null()).then(lit("null")).when(col("x").is_in(m)).then(col("x")).otherwise(lit(0)),
             lambda v, m: "null" if v is None else v if oracle_is_in(v, m) else 0),
}


def _raise(kind: type) -> Any:
    raise kind


@pytest.mark.parametrize("name", sorted(VALUE_FUNCTIONS))
@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(xs=columns, lists=st.sampled_from([False, False, True]), members=st.sampled_from([[1, 2], [0.0, 3.5], ["3", "x", ""], [True], []]))
def test_value_functions_match_the_oracle_or_fail_alike(name, xs, lists, members):
    """One function on a column of one kind (typed in the engine) or of several (held in
    Python): the oracle's values on both paths, or, where the oracle refuses a value, the
    same error on both, a TypeError or ValueError that names the expression and the value."""
    if lists:
        xs = [x if i % 2 else [x, "a"][: i % 3] for i, x in enumerate(xs)]
    make, oracle = VALUE_FUNCTIONS[name]
    expr = make(members)
    records = [{"x": x} for x in xs]
    expected = []
    for x in xs:
        try:
            expected.append(None if x is None and name != "when" else oracle(x, members))
        except (TypeError, ValueError, OverflowError) as e:
            expected.append(e)
    out, error, _ = both([json.dumps(r, ensure_ascii=False).encode() for r in records], lambda ds: ds.with_columns(v=expr))
    failed = next((e for e in expected if isinstance(e, Exception)), None)
    event(f"{name}: {'error' if failed else 'values'}")
    if failed is not None:
        assert error is not None and error.split(":")[0] in ("TypeError", "ValueError") and repr(expr) in error
        return
    if any(isinstance(v, float) and not math.isfinite(v) for v in expected):
        assert error is not None  # JSON cannot hold NaN (cast("float") of "nan"): both refuse to write it
        return
    assert error is None, error
    for x, got, want in zip(xs, out, expected, strict=True):
        if name == "hash" and isinstance(x, (float, list)):
            continue  # its bytes are orjson's text of the value: checked across paths by `both`
        assert same(got["v"], want), (name, x, got["v"], want)


def test_errors_name_the_expression_and_the_value():
    cases = [
        (col("x").cast("int"), {"x": "3.5"}, ValueError, "col('x').cast('int') cannot convert str '3.5'"),
        (col("x").cast("bool"), {"x": "false"}, TypeError, "col('x').cast('bool') needs one of bool, int, float"),
        (col("x").cast("float"), {"x": [1]}, TypeError, "col('x').cast('float') needs one of float, int, bool, str, got list [1]"),
        (col("x").word_count(), {"x": 3}, TypeError, "col('x').word_count() needs a string, got int 3"),
        (col("x").list_len(), {"x": "ab"}, TypeError, "col('x').list_len() needs a list, got str 'ab'"),
        (when(col("x")).then(1), {"x": 2}, TypeError, "when(col('x')) needs true, false or null, got int 2"),
    ]
    for expr, record, kind, message in cases:
        for columnar in (False, True):
            with tempfile.TemporaryDirectory() as work:
                _, error, _ = run(columnar, jsonl([record]), lambda ds, e=expr: ds.with_columns(v=e), work)
            assert error.startswith(f"{kind.__name__}: {message}"), (columnar, error)


def test_bad_arguments_fail_when_the_expression_is_built():
    with pytest.raises(TypeError, match="one kind"):
        col("x").is_in([1, "1"])
    with pytest.raises(ValueError, match="NaN"):
        col("x").is_in([float("nan")])
    with pytest.raises(TypeError, match="list, tuple or set"):
        col("x").is_in("abc")
    with pytest.raises(ValueError, match="not a regular expression"):
        col("x").str_matches("(")
    with pytest.raises(ValueError, match="cast"):
        col("x").cast("date")
    with pytest.raises(TypeError, match="one string"):
        col("x").str_contains(3)
    with pytest.raises(TypeError, match="otherwise"):
        when(col("a")).then(1).otherwise(2).otherwise(3)
    with pytest.raises(TypeError, match="before otherwise"):
        when(col("a")).then(1).otherwise(2).when(col("b"))


# ---------------------------------------------------------------- when / then / otherwise

def test_when_is_sql_case():
    """First true branch; a null condition counts as false; no otherwise gives null; only the
    branch taken is evaluated (the str_len of an int below never runs), on both paths."""
    expr = (when(col("a") > 0).then(lit("pos")).when(col("a") < 0).then(col("a").str_len())
            .when(col("a").is_null()).then(lit("none")))
    records = [{"a": 3}, {"a": 0}, {"a": None}, {}]
    out, error, _ = both(jsonl(records), lambda ds: ds.with_columns(v=expr))
    assert error is None and [r["v"] for r in out] == ["pos", None, "none", "none"]
    assert repr(expr) == ("when((col('a') > lit(0))).then(lit('pos')).when((col('a') < lit(0))).then(col('a').str_len())"
                          ".when(col('a').is_null()).then(lit('none'))")


def test_when_in_the_engine_keeps_the_kind_python_gives():
    """Branches of one kind run in Polars; an int beside a float would come back a float
    from Polars, so that one runs in Python and keeps its int."""
    records = [{"a": i, "f": i / 2} for i in range(-2, 3)]
    same_kind = when(col("a") > 0).then(col("a")).otherwise(lit(-1))
    mixed = when(col("a") > 0).then(col("a")).otherwise(col("f"))
    out, _, counters = both(jsonl(records), lambda ds: ds.with_columns(v=same_kind))
    assert [r["v"] for r in out] == [-1, -1, -1, 1, 2] and "zephyr/python_expressions" not in counters
    out, _, counters = both(jsonl(records), lambda ds: ds.with_columns(v=mixed))
    assert [r["v"] for r in out] == [-1.0, -0.5, 0.0, 1, 2] and counters["zephyr/python_expressions"] == 1
    assert [type(r["v"]) for r in out] == [float, float, float, int, int]


# ---------------------------------------------------------------- which translate

SCHEMA = {"s": pl.String, "i": pl.Int64, "f": pl.Float64, "b": pl.Boolean, "l": pl.List(pl.Int64), "n": pl.Null}
TRANSLATED = [
    col("s").str_contains("a"), col("s").str_starts_with("a"), col("s").str_ends_with("a"), col("s").str_strip(), col("s").word_count(), col("s").str_matches("^[a-z]+(x|y)?"),
    col("s").is_in(["a"]), col("i").is_in([1, 2]), col("b").is_in([True]), col("f").is_in([0.0, -1.5]), col("s").hash(), col("i").hash(), col("b").hash(),
    col("i").cast("str"), col("i").cast("float"), col("b").cast("str"), col("b").cast("int"), col("f").cast("bool"),
    col("i").cast("bool"), col("s").cast("str"), col("l").list_len(), col("n").str_lower(), col("n").cast("int"),
    when(col("b")).then(col("s")).otherwise(lit(None)), when(col("i") > 1).then(lit(1)).when(col("b")).then(col("i")),
    col("s").hash() == col("s").str_strip().hash(),
]
REFUSED = [  # Python decides: a different result, an error Polars would not raise, or Python's own text
    col("s").str_matches("\\w"), col("s").str_matches("a$"), col("s").str_matches("(?i)a"), col("s").str_matches("(a)\\1"),
    col("s").str_lower(), col("s").str_upper(), col("i").str_lower(), col("f").is_in([1]), col("i").is_in([1.0]), col("i").is_in([True]), col("f").hash(),
    col("l").hash(), col("f").cast("str"), col("f").cast("int"), col("s").cast("int"), col("s").cast("float"),
    col("s").cast("bool"), col("s").list_len(), when(col("i")).then(1), when(col("b")).then(col("i")).otherwise(col("f")),
    col("s").hash() < 5, col("missing").str_lower(),
]


@pytest.mark.parametrize("expr", TRANSLATED, ids=repr)
def test_translated_where_polars_agrees(expr):
    assert to_polars(expr, SCHEMA) is not None


@pytest.mark.parametrize("expr", REFUSED, ids=repr)
def test_left_to_python_where_polars_could_differ(expr):
    assert to_polars(expr, SCHEMA) is None


def test_a_filter_on_a_function_is_a_mask():
    assert to_polars_filter(col("s").str_contains("a") & col("i").is_in([1]), SCHEMA) is not None
    assert to_polars_filter(col("s").word_count(), SCHEMA) is None  # not a boolean: Python raises


def test_strip_and_word_count_use_pythons_whitespace():
    assert python_whitespace() == "".join(c for c in map(chr, range(0x110000)) if c.isspace())
    assert {"\x1c", "\x85", "\u3000"} <= set(python_whitespace()) and not set(NOT_WHITESPACE) & set(python_whitespace())
    strings = [f"{w}a{w}b{z}c{w}" for w in WHITESPACE for z in NOT_WHITESPACE]
    frame = pl.DataFrame({"s": strings})
    strip = frame.select(to_polars(col("s").str_strip(), {"s": pl.String})[0]).to_series().to_list()
    words = frame.select(to_polars(col("s").word_count(), {"s": pl.String})[0]).to_series().to_list()
    assert strip == [s.strip() for s in strings] and words == [len(s.split()) for s in strings]


# ---------------------------------------------------------------- regular expressions

@pytest.mark.parametrize("pattern", ["", "abc", "^a.c", "[a-z0-9_-]+", "[^\\]x]", "(?:ab|cd)*?e", "a{2,5}", "x{3,}", "\\$\\.\\(",
                                     "\\n\\t", "é+𝒳", "a|", "[-a]", "(a(b)c)?"])
def test_patterns_polars_reads_alike(pattern):
    assert polars_reads_alike(pattern)


@pytest.mark.parametrize("pattern", ["a$", "\\d", "\\w", "\\s", "\\b", "\\Z", "\\x41", "\\u0041", "(?i)a", "(?=a)", "(?<=a)b",
                                     "(a)\\1", "(?P<n>a)", "[[:alpha:]]", "[a&&b]", "[a--b]", "[a~~b]", "a{,3}", "a{1001}",
                                     "a*+", "a{", "]", "}", "[]a]", "[a-]b-c]", "\\/"])
def test_patterns_left_to_python(pattern):
    assert not polars_reads_alike(pattern)


pattern_parts = st.sampled_from(["a", "b", "é", "𝒳", ".", "^", "\\.", "\\n", "[ab]", "[^a]", "[a-c]", "[-b]", "(", ")", "(?:",
                                 "|", "*", "+", "?", "{2}", "{1,3}", "*?", "$", "\\d", "\\w", "\n", " ", "\x1c"])


@settings(max_examples=300, deadline=None)
@given(pattern=st.lists(pattern_parts, max_size=7).map("".join), subjects=st.lists(st.text("abé𝒳.\n \x1c-c", max_size=6), min_size=1, max_size=8))
def test_a_pattern_polars_reads_alike_matches_what_re_search_does(pattern, subjects):
    try:
        compiled = re.compile(pattern)
    except re.error:
        return
    if not polars_reads_alike(pattern):
        event("left to Python")
        return
    event("translated")
    got = pl.Series(subjects, dtype=pl.String).str.contains(pattern).to_list()
    assert got == [compiled.search(s) is not None for s in subjects]


# ---------------------------------------------------------------- hash, list_len, plans

def test_hash_is_the_same_everywhere():
    """Pinned values: changing them breaks every hash users stored (sampling, bucketing)."""
    assert col("x").hash().evaluate({"x": "a"}) == xxhash.xxh64_intdigest(b"sa") == 5931315628352895258
    assert col("x").hash().evaluate({"x": 1}) == xxhash.xxh64_intdigest(b"j1")
    assert col("x").hash().evaluate({"x": None}) is None
    values = {col("x").hash().evaluate({"x": v}) for v in (1, 1.0, True, "1", [1])}
    assert len(values) == 5  # different keys, different hashes
    code = "from zephyr import col; print(col('x').hash().evaluate({'x': 'a'}))"
    other = subprocess.run([sys.executable, "-c", code], env={**os.environ, "PYTHONHASHSEED": "7"}, capture_output=True, text=True, check=True)
    assert int(other.stdout) == 5931315628352895258


def test_list_len_of_a_parquet_list_column_runs_in_polars(tmp_path):
    path = tmp_path / "in.parquet"
    pq.write_table(pa.table({"l": pa.array([[1, None], None, [], [2, 3, 4]], pa.list_(pa.int64()))}), path)
    results = {}
    for columnar in ("0", "1"):
        os.environ["ZEPHYR_COLUMNAR"] = columnar
        try:
            backend = create_backend("sync", progress=False, scratch_dir=str(tmp_path / f"s{columnar}"))
            ds = Dataset.from_files([str(path)]).load_parquet().with_columns(n=col("l").list_len())
            execution = backend.execute(ds.write_jsonl(str(tmp_path / f"o{columnar}-{{shard}}.jsonl")))
            list(execution)
            backend.close()
        finally:
            os.environ.pop("ZEPHYR_COLUMNAR", None)
        results[columnar] = [json.loads(line)["n"] for line in (tmp_path / f"o{columnar}-0.jsonl").read_text().splitlines()]
        counters = dict(execution.counters)
    assert results["0"] == results["1"] == [2, None, 0, 3]
    assert "zephyr/python_expressions" not in counters


def test_plans_print_and_fingerprint_the_expressions():
    ds = Dataset.from_list([{"s": "a"}])
    a = ds.filter(col("s").str_contains("a")).with_columns(k=col("s").is_in({"c", "a", "b"}))
    b = ds.filter(col("s").str_contains("b")).with_columns(k=col("s").is_in({"c", "a", "b"}))
    assert "filter(col('s').str_contains('a')) -> with_columns(k=col('s').is_in(['a', 'b', 'c']))" in a.describe()
    assert [s.fingerprint for s in a.plan().stages] != [s.fingerprint for s in b.plan().stages]
    case = when(col("s").str_matches("^a")).then(col("s").cast("int")).otherwise(col("s").hash())
    assert repr(pickle.loads(pickle.dumps(case))) == repr(case)
