"""Writer -> reader round trips over generated records (the oracle suite's writer part).

Every writer (JSONL with each compression, Parquet, binary) is fed generated records and read
back with Zephyr's readers. The result must equal what the small plain-Python oracles below
say the documented conversions give, or the write must fail with UnwritableRecordError (a
TypeError for write_binary) naming the record (and the field), leaving no output behind.
The oracles state the rules on their own; they share no code with the writers.

The named regressions of issue 21 follow the property tests: each pins one defect that
existed before the fix (Parquet dropping fields and truncating floats, JSONL writing NaN as
null, big integers read as floats, non-object lines failing without a line number), checked
against values written out by hand.
"""

from __future__ import annotations

import bz2
import dataclasses
import gzip
import lzma
import math
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable

import fsspec
import orjson
import pytest
import zstandard
from hypothesis import assume, event, given, settings
from hypothesis import strategies as st

from zephyr import Dataset, ShardError, counters, create_backend
from zephyr.io import BadRecordError, TruncatedInputError, UnwritableRecordError, open_input, read_jsonl, read_parquet
from zephyr.io.binary import write_binary_file
from zephyr.io.jsonl import write_jsonl_file
from zephyr.io.parquet import write_parquet_file
from zephyr.status import RECORD_NAME


@dataclasses.dataclass
class Point:
    x: object
    y: object


class Tag(str):
    """A str subclass (as a StrEnum is): written as its str."""


class Refused(Exception):
    """The oracle's verdict that a record cannot be written unchanged; `field` is where.
    `empty`: a dict with no keys in any record (Parquet has no struct without fields)."""

    def __init__(self, field: str, empty: bool = False, kind: str = ""):
        super().__init__(field)
        self.field = field
        self.empty = empty
        self.kind = kind  # a whole item that is not a record: its type


_SCRATCH: dict[str, str] = {}  # "dir": this module's scratch folder (hypothesis examples cannot take tmp_path)


@pytest.fixture(autouse=True, scope="module")
def _scratch():
    """One folder for every example's files, removed when the module ends (even on failure):
    each example made its own under the temp dir and left it there, 500 per run."""
    _SCRATCH["dir"] = tempfile.mkdtemp(prefix="zephyr-roundtrip-tests-")
    try:
        yield
    finally:
        shutil.rmtree(_SCRATCH.pop("dir"), ignore_errors=True)


def _mkdtemp(prefix: str) -> str:
    return tempfile.mkdtemp(prefix=prefix, dir=_SCRATCH["dir"])


def _scaled(examples: int) -> int:
    """`examples` at the 'ci' profile (50 by default), scaled with the loaded profile's
    count, so the 'nightly' profile runs these 20 times longer."""
    return max(1, examples * settings().max_examples // 50)


# ---- generated records ---------------------------------------------------------------------------

_TEXT = st.one_of(
    st.text(max_size=6),
    st.sampled_from(["", "é", "\U0001d11e", "😀 astral", "\ud800", "a\udfffb", "line\nbreak", '"quoted"']),
    st.text(max_size=3).map(Tag),
)
_INTS = st.one_of(st.integers(-5, 5), st.integers(-(2**70), 2**70), st.sampled_from([2**53, 2**53 + 1, -(2**63), 2**63 - 1, 2**63, 2**64]))
_FLOATS = st.one_of(st.floats(allow_nan=True, allow_infinity=True), st.sampled_from([0.5, -0.0, 2.7]))
_LEAVES = st.one_of(st.none(), st.booleans(), _INTS, _FLOATS, _TEXT, st.binary(max_size=4))
_WILD = st.recursive(
    _LEAVES,
    lambda inner: st.one_of(
        st.lists(inner, max_size=3),
        st.lists(inner, max_size=3).map(tuple),
        st.dictionaries(st.sampled_from(["a", "b", "c"]), inner, max_size=3),
        st.builds(Point, inner, inner),
    ),
    max_leaves=6,
)
# Mostly consistent fields (so Parquet writes succeed often), with missing keys, None,
# ints mixed with floats, nested structs and lists, and one wild field now and then.
_RECORD = st.fixed_dictionaries(
    {},
    optional={
        "id": st.one_of(st.none(), st.integers(-(2**40), 2**40)),
        "score": st.one_of(st.none(), st.integers(-1000, 1000), st.floats(allow_nan=True, allow_infinity=True)),
        "text": st.one_of(st.none(), st.text(max_size=8), st.sampled_from(["\U0001f600", "\ud800"])),
        "meta": st.one_of(
            st.none(),
            st.fixed_dictionaries({}, optional={"lang": st.text(max_size=2), "n": st.integers(0, 9), "tags": st.lists(st.text(max_size=2), max_size=2)}),
        ),
        "vec": st.lists(st.one_of(st.integers(-3, 3), st.floats(-1, 1)), max_size=3),
        "wild": _WILD,
    },
)
_RECORDS = st.lists(_RECORD, max_size=8)
# a list in four may hold items that are no records (a number, a list, None...)
_JSONL_ITEMS = st.one_of(_RECORDS, _RECORDS, _RECORDS, st.lists(st.one_of(_RECORD, _WILD), max_size=8))


# ---- oracles -------------------------------------------------------------------------------------


def _encodable(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return False
    return True


def _at(field: str, key) -> str:
    return f"{field}[{key}]" if isinstance(key, int) else (f"{field}.{key}" if field else key)


def json_expected(value, field: str = ""):
    """What a JSON line gives back: tuples as lists, dataclasses as dicts, str subclasses as
    str; NaN/infinity, bytes, lone surrogates, non-str keys and other objects are refused."""
    if value is None or type(value) is bool or type(value) is int:
        return value
    if type(value) is float:
        if not math.isfinite(value):
            raise Refused(field)
        return value
    if isinstance(value, str):
        if not _encodable(value):
            raise Refused(field)
        return str(value)
    if isinstance(value, dict):
        return {k: json_expected(v, _at(field, k)) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [json_expected(v, _at(field, i)) for i, v in enumerate(value)]
    if isinstance(value, Point):
        return {"x": json_expected(value.x, _at(field, "x")), "y": json_expected(value.y, _at(field, "y"))}
    raise Refused(field)


def json_record_expected(value):
    """What `load_jsonl` gives back for an item written as a line: only a JSON object (a dict,
    or a dataclass as its fields) is a record; any other item is refused, by its type."""
    if not isinstance(value, (dict, Point)):
        raise Refused("", kind="None" if value is None else type(value).__name__)
    return json_expected(value)


def _kind(value) -> str:
    if type(value) is bool:
        return "bool"
    if type(value) is int:
        return "int"
    if type(value) is float:
        return "float"
    if isinstance(value, str):
        return "str"
    if type(value) is bytes:
        return "bytes"
    if isinstance(value, dict):
        return "dict"
    if isinstance(value, (list, tuple)):
        return "list"
    return "other"


def parquet_shape(values: list, field: str):
    """The one column type holding every value of a field exactly, or Refused."""
    present = [v for v in values if v is not None]
    kinds = {_kind(v) for v in present}
    if not kinds:
        return ("null",)
    if "other" in kinds:
        raise Refused(field)
    ints = [v for v in present if _kind(v) == "int"]  # one Parquet integer: int64, or uint64 when none is negative
    if ints and not (all(-(2**63) <= v < 2**63 for v in ints) or all(0 <= v < 2**64 for v in ints)):
        raise Refused(field)
    if kinds == {"int", "float"}:
        if any(abs(v) > 2**53 for v in present if _kind(v) == "int"):
            raise Refused(field)
        return ("float",)
    if len(kinds) > 1:
        raise Refused(field)
    kind = kinds.pop()
    if kind == "str" and not all(map(_encodable, present)):
        raise Refused(field)
    if kind == "dict":
        names = list(dict.fromkeys(k for v in present for k in v))
        if not names:
            raise Refused(field, empty=True)
        fields, empty = {}, None
        for n in names:  # a conflict anywhere wins over a keyless dict
            try:
                fields[n] = parquet_shape([v.get(n) for v in present], _at(field, n))
            except Refused as refused:
                if not refused.empty:
                    raise
                empty = empty or refused
        if empty:
            raise empty
        return ("dict", fields)
    if kind == "list":
        return ("list", parquet_shape([e for v in present for e in v], f"{field}[]"))
    return (kind,)


def parquet_value(shape, value):
    if value is None:
        return None
    if shape[0] == "float":
        return float(value)
    if shape[0] == "str":
        return str(value)
    if shape[0] == "dict":
        return {n: parquet_value(s, value.get(n)) for n, s in shape[1].items()}
    if shape[0] == "list":
        return [parquet_value(shape[1], e) for e in value]
    return value


def parquet_expected(records: list) -> list:
    """Every field of every record (missing -> None), ints as floats in a float column."""
    if not records:
        return []
    shape = parquet_shape(records, "")
    return [parquet_value(shape, r) for r in records]


def first_refused(records: list, oracle) -> int | None:
    """None when the oracle accepts the records, else the index of the first record whose
    prefix it refuses (writers stop there); a refusal for keyless dicts only (which later
    records could have given keys) is blamed on the first record of the batch."""
    try:
        oracle(records)
        return None
    except Refused:
        pass
    for i in range(len(records)):
        try:
            oracle(records[: i + 1])
        except Refused as refused:
            if not refused.empty:
                return i
    return 0


def same(a, b) -> bool:
    """Equal values of identical types (1, 1.0 and True differ; NaN equals NaN)."""
    if type(a) is not type(b):
        return False
    if type(a) is float:
        return a == b or (math.isnan(a) and math.isnan(b))
    if type(a) is dict:
        return a.keys() == b.keys() and all(same(a[k], b[k]) for k in a)
    if type(a) is list:
        return len(a) == len(b) and all(map(same, a, b))
    return a == b


# ---- the round trips -----------------------------------------------------------------------------


def _target(where: str, name: str) -> tuple[str, Callable[[], bool]]:
    """A fresh output path on local disk or memory://, and a check that nothing is there."""
    if where == "memory":
        path = f"memory://roundtrip-{uuid.uuid4().hex}/{name}"
        fs = fsspec.filesystem("memory")
        return path, lambda: not fs.exists(path)
    directory = _mkdtemp("roundtrip-")
    path = os.path.join(directory, name)
    return path, lambda: os.listdir(directory) == []


def _check_refusal(error: Exception, path: str, index: int, field: str | None, kind: str = "") -> None:
    event("refused")
    message = str(error)
    assert path in message and f"record {index}" in message, message
    if field:
        assert f"'{field}'" in message, message
    if kind:
        event("refused: not an object")
        assert f"the item is {kind} " in message and "not a dict" in message, message


@pytest.mark.parametrize("where", ["local", "memory"])
@pytest.mark.parametrize("suffix", ["", ".gz", ".zst", ".bz2", ".xz"])
@settings(max_examples=_scaled(50))
@given(records=_JSONL_ITEMS)
def test_jsonl_round_trip_is_exact_or_refused_by_name(where, suffix, records):
    path, nothing_there = _target(where, f"o.jsonl{suffix}")
    bad = first_refused(records, lambda rs: [json_record_expected(r) for r in rs])
    if bad is None:
        assert write_jsonl_file(records, path) == len(records)
        back = list(read_jsonl(path))
        assert same(back, [json_record_expected(r) for r in records])
        event("written")
    else:
        with pytest.raises(UnwritableRecordError) as info:
            write_jsonl_file(records, path)
        try:
            json_record_expected(records[bad])
        except Refused as refused:
            _check_refusal(info.value, path, bad, refused.field, refused.kind)
        assert nothing_there()


@pytest.mark.parametrize("where", ["local", "memory"])
@settings(max_examples=_scaled(150))
@given(records=_RECORDS)
def test_parquet_round_trip_is_exact_or_refused_by_name(where, records):
    path, nothing_there = _target(where, "o.parquet")
    bad = first_refused(records, parquet_expected)
    if bad is None:
        assert write_parquet_file(records, path) == len(records)
        assert same(list(read_parquet(path)), parquet_expected(records))
        event("written")
    else:
        with pytest.raises(UnwritableRecordError) as info:
            write_parquet_file(records, path)
        _check_refusal(info.value, path, bad, None)
        assert nothing_there()


_BATCH = 8192  # the Parquet writer's batch: widening across batches re-encodes earlier ones


@settings(max_examples=_scaled(15))
@given(head=st.lists(_RECORD, min_size=1, max_size=3), tail=_RECORDS)
def test_parquet_widening_across_batches_is_exact_or_refused(head, tail):
    """The first batch fixes little: fields and wider types first seen in a later batch.
    (A dict with no keys in every record of a batch is refused even when a later batch
    would give it keys: documented, so such heads are not drawn.)"""
    try:
        parquet_expected(head)
    except Refused as refused:
        assume(not refused.empty)
    records = head * (_BATCH // len(head) + 1) + tail
    path, nothing_there = _target("local", "o.parquet")
    try:
        expected = parquet_expected(records)
    except Refused:
        with pytest.raises(UnwritableRecordError):
            write_parquet_file(records, path)
        assert nothing_there()
        return
    write_parquet_file(records, path)
    assert same(list(read_parquet(path)), expected)


@pytest.mark.parametrize("suffix", ["", ".gz", ".zst"])
@settings(max_examples=_scaled(25))
@given(items=st.lists(st.one_of(st.binary(max_size=20), st.binary(max_size=3).map(bytearray), st.text(max_size=2), st.integers()), max_size=6))
def test_binary_round_trip_is_exact_or_refused_by_name(suffix, items):
    path, nothing_there = _target("local", f"o.bin{suffix}")
    bad = next((i for i, item in enumerate(items) if not isinstance(item, (bytes, bytearray))), None)
    if bad is None:
        write_binary_file(items, path)
        with open_input(path) as f:
            assert f.read() == b"".join(items)
    else:
        with pytest.raises(TypeError, match=rf"record {bad} "):
            write_binary_file(items, path)
        assert nothing_there()


@settings(max_examples=_scaled(10))
@given(records=_RECORDS)
def test_pipeline_write_then_load_on_sync_backend(records):
    """The same promise through Dataset pipelines: write_jsonl / write_parquet, then load."""
    backend = create_backend("sync", progress=False)
    directory = _mkdtemp("roundtrip-pipeline-")
    one_shard = Dataset.from_list([records]).flat_map(lambda rs: rs)
    for name, oracle, write, load in (
        ("o.jsonl.zst", lambda rs: [json_expected(r) for r in rs], Dataset.write_jsonl, Dataset.load_jsonl),
        ("o.parquet", parquet_expected, Dataset.write_parquet, Dataset.load_parquet),
    ):
        path = os.path.join(directory, name)
        bad = first_refused(records, oracle)
        if bad is None:
            assert list(backend.execute(write(one_shard, path))) == [path]
            assert same(list(backend.execute(load(Dataset.from_list([path])))), oracle(records))
        else:
            with pytest.raises(ShardError, match=rf"shard 0 .*UnwritableRecordError: .*record {bad}"):
                list(backend.execute(write(one_shard, path)))
            assert not os.path.exists(path)
    backend.close()


@settings(max_examples=_scaled(100))
@given(
    mantissa=st.integers(0, 10**25),
    fraction=st.integers(0, 10**22),
    exponent=st.integers(-330, 310),
    value=st.floats(allow_nan=False, allow_infinity=False),
)
def test_lines_with_long_digit_runs_read_floats_as_orjson_does(mantissa, fraction, exponent, value):
    """Lines holding 19+ digits are decoded by the stdlib json (for big integers): every
    float on them must come out as orjson alone reads it."""
    import orjson

    line = f'{{"a": {mantissa}.{fraction}e{exponent}, "b": {value!r}, "c": {mantissa}.{fraction}, "pad": "{"9" * 19}"}}'.encode()
    try:
        expected = orjson.loads(line)
    except orjson.JSONDecodeError:  # beyond the float range: orjson refuses it, so must we
        expected = None
    directory = _mkdtemp("roundtrip-floats-")
    path = os.path.join(directory, "f.jsonl")
    with open(path, "wb") as f:
        f.write(line + b"\n")
    if expected is None:
        with pytest.raises(Exception, match=r"f\.jsonl:1: malformed JSON"):
            list(read_jsonl(path))
    else:
        assert same(list(read_jsonl(path)), [expected])


# ---- named regressions (issue 21) ---------------------------------------------------------------


def _no_outputs(directory) -> bool:
    """No file (the run record beside outputs is not an output)."""
    return not any(p.is_file() and p.name != RECORD_NAME for p in directory.rglob("*"))


# ---- Parquet: every field of every record, widened only where exact -------------------------------


def test_parquet_keeps_fields_that_first_records_lack(tmp_path):
    path = str(tmp_path / "o.parquet")
    rows = [{"id": 1}, {"id": 2, "text": "b"}, {"id": 3, "text": "c", "lang": "en"}]
    write_parquet_file(rows, path)
    expected = [{"id": 1, "text": None, "lang": None}, {"id": 2, "text": "b", "lang": None}, {"id": 3, "text": "c", "lang": "en"}]
    assert list(read_parquet(path)) == expected


def test_parquet_float_after_9000_ints_is_not_truncated(tmp_path):
    path = str(tmp_path / "o.parquet")
    rows = [{"x": i} for i in range(9000)] + [{"x": 2.7}]
    write_parquet_file(rows, path)
    back = [r["x"] for r in read_parquet(path)]
    assert back[-1] == 2.7
    assert back[:9000] == list(range(9000)) and all(type(v) is float for v in back)


def test_parquet_nested_struct_fields_and_list_elements_are_unioned(tmp_path):
    path = str(tmp_path / "o.parquet")
    rows = [{"m": {"a": 1}, "l": [1, 2]}] * 9000 + [{"m": {"b": "x"}, "l": [0.5, None]}, {"m": None, "l": []}]
    write_parquet_file(rows, path)
    back = list(read_parquet(path))
    assert back[0] == {"m": {"a": 1, "b": None}, "l": [1, 2]}
    assert back[9000] == {"m": {"a": None, "b": "x"}, "l": [0.5, None]}
    assert back[9001] == {"m": None, "l": []}


@pytest.mark.parametrize(
    "later, kinds",
    [("text", ("int", "str")), (True, ("int", "bool")), (2**64, ("int", "beyond")), (2**60 + 0.5, ("int", "float"))],
)
def test_parquet_refuses_inexact_widening_naming_field_types_record_and_path(tmp_path, later, kinds):
    path = str(tmp_path / "o.parquet")
    rows = [{"meta": {"n": 2**60 + 1}} for _ in range(9000)] + [{"meta": {"n": later}}]
    with pytest.raises(UnwritableRecordError) as info:
        write_parquet_file(rows, path)
    message = str(info.value)
    assert "meta.n" in message and path in message and "record 9000" in message
    assert all(k in message for k in kinds), message
    assert _no_outputs(tmp_path)


def test_parquet_records_without_fields_are_refused_not_lost(tmp_path):
    """Found while writing the oracle: rows of `{}` were written as a file of 0 rows."""
    path = str(tmp_path / "o.parquet")
    with pytest.raises(UnwritableRecordError, match="record 0: a record with no fields"):
        write_parquet_file([{}, {}], path)
    assert _no_outputs(tmp_path)


def test_parquet_keyless_dict_takes_the_keys_later_records_give_it(tmp_path):
    """Found by the round-trip property test in a first version of the new writer (not in the
    old one): an empty dict was refused although a later record of its batch gave it keys."""
    path = str(tmp_path / "o.parquet")
    write_parquet_file([{"m": {}}, {"m": {"a": 1}}], path)
    assert list(read_parquet(path)) == [{"m": {"a": None}}, {"m": {"a": 1}}]


def test_parquet_user_schema_refuses_values_it_would_truncate(tmp_path):
    import pyarrow as pa

    path = str(tmp_path / "o.parquet")
    with pytest.raises(UnwritableRecordError, match=r"record 1.*field 'x'.*2\.7"):
        write_parquet_file([{"x": 1}, {"x": 2.7}], path, schema=pa.schema([("x", pa.int64())]))
    assert _no_outputs(tmp_path)


@pytest.mark.parametrize("case", ["missing", "none", "struct child", "list element", "nullable parent"])
def test_a_user_schemas_required_field_refuses_a_null_naming_record_and_field(tmp_path, case):
    """Regression: a null in a field the user's schema declares not nullable passed the
    conversion and failed in the Parquet writer as a bare ArrowInvalid naming no record or
    field (and so did write_vortex, which also named its staging file)."""
    import pyarrow as pa

    from zephyr.io.vortex import write_vortex_file

    good = {"a": 1, "s": {"y": 1}, "l": [1]}
    bad, field, schema = {
        "missing": ({"s": {"y": 1}, "l": [1]}, "a", [pa.field("a", pa.int64(), nullable=False)]),
        "none": ({**good, "a": None}, "a", [pa.field("a", pa.int64(), nullable=False)]),
        "struct child": ({**good, "s": {"y": None}}, "s.y", [pa.field("s", pa.struct([pa.field("y", pa.int64(), nullable=False)]))]),
        "list element": ({**good, "l": [1, None]}, "l[]", [pa.field("l", pa.list_(pa.field("item", pa.int64(), nullable=False)))]),
        "nullable parent": ({**good, "s": None}, None, [pa.field("s", pa.struct([pa.field("y", pa.int64(), nullable=False)]))]),
    }[case]
    names = {f.name for f in schema}
    schema = pa.schema(schema + [pa.field(n, t) for n, t in (("a", pa.int64()), ("s", pa.struct([("y", pa.int64())])), ("l", pa.list_(pa.int64()))) if n not in names])
    records = [good] * 9000 + [bad, good]
    for write, name in ((write_parquet_file, "o.parquet"), (write_vortex_file, "o.vortex")):
        path = str(tmp_path / name)
        if field is None:  # a null struct holds no child: allowed, and read back as a null
            write(records, path, schema)
            continue
        with pytest.raises(UnwritableRecordError) as info:
            write(records, path, schema)
        assert str(info.value).startswith(f"{path}: record 9000, field '{field}': is null or missing")
        assert _no_outputs(tmp_path)
    if field is None:
        assert list(read_parquet(str(tmp_path / "o.parquet")))[9000]["s"] is None


def test_parquet_conflict_in_a_pipeline_names_the_shard(local_backend, tmp_path):
    out = tmp_path / "out"
    ds = Dataset.from_list([[{"a": 1}, {"a": "one"}]]).flat_map(lambda rows: rows).write_parquet(str(out / "{shard}.parquet"))
    with pytest.raises(ShardError) as info:
        list(local_backend.execute(ds))
    message = str(info.value)
    assert "shard 0" in message and "UnwritableRecordError" in message and "record 1" in message and "'a'" in message
    assert _no_outputs(out)


# ---- JSON lines: nothing written that reads back different ----------------------------------------


@pytest.mark.parametrize(
    "value, words",
    [(math.nan, ("nan",)), (-math.inf, ("inf",)), (b"x", ("bytes",)), ({1: 2}, ("key",)), ("\ud800", ("surrogate",))],
)
def test_jsonl_refuses_what_json_would_change_naming_record_and_field(tmp_path, value, words):
    path = str(tmp_path / "o.jsonl")
    with pytest.raises(UnwritableRecordError) as info:
        write_jsonl_file([{"ok": 1}, {"a": [{"b": value}]}], path)
    message = str(info.value)
    assert "record 1" in message and "a[0].b" in message and path in message
    assert all(w in message.lower() for w in words), message
    assert _no_outputs(tmp_path)


def test_jsonl_documented_conversions_are_written(tmp_path):
    import dataclasses

    @dataclasses.dataclass
    class Point:
        x: int
        tags: tuple

    class Name(str):
        pass

    path = str(tmp_path / "o.jsonl")
    write_jsonl_file([{"p": Point(1, ("a",)), "t": (1, 2), "n": Name("z")}, {"big": [2**64, -(2**70)], "p": Point(2**65, ())}], path)
    assert list(read_jsonl(path)) == [
        {"p": {"x": 1, "tags": ["a"]}, "t": [1, 2], "n": "z"},
        {"big": [2**64, -(2**70)], "p": {"x": 2**65, "tags": []}},
    ]


# ---- JSON lines reading: big integers exact, non-objects are bad records --------------------------


def test_load_jsonl_keeps_integers_beyond_64_bits_so_dedup_keeps_both(local_backend, tmp_path):
    path = tmp_path / "ids.jsonl"
    path.write_text('{"id": 18446744073709551616}\n{"id": 18446744073709551617}\n{"id": -99999999999999999999, "f": 0.1}\n')
    assert list(read_jsonl(str(path))) == [{"id": 2**64}, {"id": 2**64 + 1}, {"id": -99999999999999999999, "f": 0.1}]
    ds = Dataset.from_list([str(path)]).load_jsonl().deduplicate(lambda r: r["id"])
    assert sorted(r["id"] for r in local_backend.execute(ds)) == sorted([2**64, 2**64 + 1, -99999999999999999999])


def test_long_digit_runs_inside_strings_and_floats_read_as_orjson_reads_them(tmp_path):
    lines = [b'{"s": "12345678901234567890123", "f": 1.0000000000000000000001, "e": 12345678901234567890e-5}']
    path = tmp_path / "x.jsonl"
    path.write_bytes(b"\n".join(lines) + b"\n")
    assert list(read_jsonl(str(path))) == [orjson.loads(lines[0])]


@pytest.mark.parametrize("line", [b"[1, 2]", b"3", b'"text"', b"null"])
def test_a_json_line_that_is_not_an_object_is_a_bad_record(local_backend, tmp_path, line):
    path = tmp_path / "mixed.jsonl"
    path.write_bytes(b'{"a": 1}\n' + line + b'\n{"a": 2}\n')
    ds = Dataset.from_list([str(path)]).load_jsonl().filter(lambda r: r["a"] > 0)
    with pytest.raises(ShardError) as info:
        list(local_backend.execute(ds))
    message = str(info.value)
    assert f"{path}:2" in message and "BadRecordError" in message and "shard 0" in message
    skipping = Dataset.from_list([str(path)]).load_jsonl(on_bad_record="skip").select("a").deduplicate(lambda r: r["a"])
    execution = local_backend.execute(skipping)
    assert sorted(r["a"] for r in execution) == [1, 2]
    assert execution.counters["zephyr/bad_records"] == 1


def test_read_jsonl_names_the_line_of_a_non_object(tmp_path):
    path = tmp_path / "arr.jsonl"
    path.write_bytes(b'{"a": 1}\n\n[1]\n')
    with pytest.raises(BadRecordError, match=rf"{path}:3: .*object.*list"):
        list(read_jsonl(str(path)))
    with counters.collecting() as seen:
        assert list(read_jsonl(str(path), on_bad_record="skip")) == [{"a": 1}]
    assert seen["zephyr/bad_records"] == 1


# ---- compression: files we write are one frame / member, so every cut is detected -----------------


def _zstd_frames(data: bytes) -> int:
    frames = 0
    while data:
        d = zstandard.ZstdDecompressor().decompressobj()
        d.decompress(data)
        assert d.eof
        data = d.unused_data
        frames += 1
    return frames


def _gzip_members(data: bytes) -> int:
    import zlib

    members = 0
    while data:
        d = zlib.decompressobj(16 + zlib.MAX_WBITS)
        d.decompress(data)
        assert d.eof
        data = d.unused_data
        members += 1
    return members


def _stdlib_streams(module) -> Callable[[bytes], int]:
    """Streams in a bzip2 (bz2) or xz (lzma) file, counted with the module's own decompressor."""

    def count(data: bytes) -> int:
        streams = 0
        while data:
            d = module.BZ2Decompressor() if module.__name__ == "bz2" else module.LZMADecompressor()
            d.decompress(data)
            assert d.eof
            data = d.unused_data
            streams += 1
        return streams

    return count


def _zstd_block_starts(data: bytes) -> list[int]:
    """Where each block of a one-frame zstd file starts (RFC 8878: the frame header's fields
    sized by its descriptor byte, then blocks, each a 3-byte header and its content)."""
    assert data[:4] == b"\x28\xb5\x2f\xfd"
    descriptor = data[4]
    single_segment = (descriptor >> 5) & 1
    position = 5 + (1 - single_segment) + (0, 1, 2, 4)[descriptor & 3] + (single_segment, 2, 4, 8)[descriptor >> 6]
    starts, last = [], 0
    while not last:
        starts.append(position)
        header = int.from_bytes(data[position:position + 3], "little")
        last, kind, size = header & 1, (header >> 1) & 3, header >> 3
        position += 3 + (1 if kind == 1 else size)  # an RLE block's content is one byte
    assert position + 4 * ((descriptor >> 2) & 1) == len(data)  # the last block, then the checksum if any
    return starts


@pytest.mark.parametrize("suffix, count", [(".zst", _zstd_frames), (".gz", _gzip_members),
                                           (".bz2", _stdlib_streams(bz2)), (".xz", _stdlib_streams(lzma))])
def test_our_compressed_output_is_one_frame_so_every_cut_is_detected(tmp_path, suffix, count):
    path = tmp_path / f"o.jsonl{suffix}"
    # 1 MB of JSON lines: two bzip2 blocks (900 kB each), eight zstd blocks (128 KiB each)
    records = [{"i": i, "text": f"row {i} " * (i % 7)} for i in range(20_000)]
    write_jsonl_file(records, str(path))
    data = path.read_bytes()
    assert count(data) == 1  # one frame: the only frame boundary is the end of the file
    cut = tmp_path / f"cut.jsonl{suffix}"
    # each cut is read up to its end: 100 cuts, and in zstd one at and one on each side of every block boundary
    blocks = _zstd_block_starts(data) if suffix == ".zst" else []
    assert suffix != ".zst" or len(blocks) >= 5
    for end in sorted({*range(0, len(data), max(1, len(data) // 100)), len(data) - 1, *(b + d for b in blocks for d in (-1, 0, 1))}):
        cut.write_bytes(data[:end])
        with pytest.raises(TruncatedInputError):
            list(read_jsonl(str(cut)))


def test_a_cut_at_a_frame_boundary_of_a_multi_frame_file_is_not_detectable(tmp_path):
    """Documented limit: files written by others as several frames/members read short when cut
    between two of them; the format has no record of how many follow."""
    first, second = b'{"a": 1}\n', b'{"a": 2}\n'
    for suffix, compress in ((".zst", lambda b: zstandard.ZstdCompressor().compress(b)), (".gz", gzip.compress)):
        path = tmp_path / f"multi.jsonl{suffix}"
        path.write_bytes(compress(first) + compress(second))
        assert list(read_jsonl(str(path))) == [{"a": 1}, {"a": 2}]
        path.write_bytes(compress(first))
        assert list(read_jsonl(str(path))) == [{"a": 1}]


@pytest.mark.parametrize(
    "arrow_type, value",
    [("int64", 2.7), ("int32", 2**40), ("float32", 0.1), ("string", b"x"), ("struct_a", {"a": 1, "b": 2}), ("list_int", [1, 2.5])],
)
def test_parquet_user_schema_refuses_every_conversion_that_changes_a_value(tmp_path, arrow_type, value):
    import pyarrow as pa

    types = {
        "int64": pa.int64(), "int32": pa.int32(), "float32": pa.float32(), "string": pa.string(),
        "struct_a": pa.struct([("a", pa.int64())]), "list_int": pa.list_(pa.int64()),
    }
    path = str(tmp_path / "o.parquet")
    with pytest.raises(UnwritableRecordError, match=r"record 1, field 'x"):
        write_parquet_file([{"x": None}, {"x": value}], path, schema=pa.schema([("x", types[arrow_type])]))
    assert _no_outputs(tmp_path)


def test_parquet_user_schema_accepts_exact_conversions(tmp_path):
    import pyarrow as pa

    path = str(tmp_path / "o.parquet")
    schema = pa.schema([("x", pa.float64()), ("s", pa.large_string()), ("m", pa.struct([("a", pa.int64()), ("b", pa.string())]))])
    write_parquet_file([{"x": 1, "s": "a", "m": {"a": 1}}, {"x": 2.5}], path, schema=schema)
    expected = [{"x": 1.0, "s": "a", "m": {"a": 1, "b": None}}, {"x": 2.5, "s": None, "m": None}]
    assert same(list(read_parquet(path)), expected)
