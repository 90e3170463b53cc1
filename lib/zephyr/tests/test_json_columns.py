"""The engine's JSON-lines scan (`zephyr.engine.scan.jsonl_frames`): the needed columns read
natively (`zephyr.engine.json_columns`) equal what orjson gives line by line, the records are
parsed lazily from the lines and equal orjson's too, and a block the native reader cannot read
exactly takes orjson's path and is counted (`zephyr/engine_scan_fallbacks`). The oracle is
orjson per line for validity and the standard library's json for values (exact big integers)."""

from __future__ import annotations

import json
import logging

import orjson
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zephyr import Dataset, col, counters, create_backend
from zephyr.engine.scan import SCAN_FALLBACKS, jsonl_frames
from zephyr.execution.summary import engine_lines
from zephyr.io.jsonl import BadRecordError

SAFE_TEXT = st.text(st.characters(blacklist_categories=("Cs",)), max_size=12)
SCALARS = st.one_of(st.none(), st.booleans(), st.integers(-(2**70), 2**70), SAFE_TEXT,
                    st.sampled_from([1e-7, 0.1 + 0.2, -0.0, 1.0, 2.5, 5e-324, 1.7976931348623157e308]))
VALUES = st.one_of(SCALARS, st.lists(SCALARS, max_size=2), st.dictionaries(SAFE_TEXT, SCALARS, max_size=2))
FORMATS = [
    lambda r: json.dumps(r, separators=(",", ":"), ensure_ascii=False).encode(),  # orjson's form (and big ints)
    lambda r: json.dumps(r).encode(),  # spaces after ":" and ",", non-ASCII as \\u escapes (surrogate pairs)
    lambda r: json.dumps(r, ensure_ascii=False).encode(),
    lambda r: json.dumps(r, separators=(",", ":"), sort_keys=True).encode(),
]
# Lines written by hand: what a writer of records cannot give (text column, then other fields).
RAW_LINES = [
    b'{"text":"a","text":"b"}', b'{"text":"a","te\\u0078t":"b"}', b'{"text":"\\ud800x"}', b'{"x":"\\udc00","text":"a"}',
    b'{"text":"\\u0000\\ud83d\\ude00"}', b'{"text":1}', b'{"text":123456789012345678901234}', b'{"text":1e400}',
    b'{"text":"a","x":NaN}', b'{"text":"a","x":-Infinity}', b'{"text":"a","x":"\xff"}', b'null', b'[1]', b'{"text":"a"} x',
    b'{"text":"a"} {"text":"b"}', b'', b'   ', b' {"text":"a"}', b'{"text":"a","x":' + b"[" * 1100 + b"]" * 1100 + b"}",
    b'{"text":"a","x":[' + b",".join([b"[]"] * 600) + b"]}", b'{"text":"Infinity NaN"}', b'{"text":{"a":[1]}}', b'{"text":-0.0}',
    b'{"n":1.0}', b'{"text":"a","x":1' + b"0" * 400 + b"}", b'{"text":"a","x":' + b"1" * 300 + b"}", b'{"n":1}', b'{"n":0.5}', b'{"n":true}', b'{"text":null}', b'{}',
]


def typed(value):
    """A comparable form that keeps types, key order and float bits: 1 != 1.0, 0.0 != -0.0."""
    if isinstance(value, dict):
        return ("dict", tuple((k, typed(v)) for k, v in value.items()))
    if isinstance(value, list):
        return ("list", tuple(map(typed, value)))
    return (type(value).__name__, value.hex() if isinstance(value, float) else value)


def oracle(line: bytes):
    """The record of a line as the record path gives it; None for a blank line; raises for a bad one."""
    if not line.strip():
        return None
    value = orjson.loads(line)  # what the record path accepts
    if type(value) is not dict:
        raise ValueError("not an object")
    return json.loads(line)  # the same values, integers beyond 64 bits exact


def scan(path, needed, size, on_bad_record="raise"):
    with counters.collecting() as counts:
        frames = list(jsonl_frames(str(path), on_bad_record, size, frozenset(needed)))
    return frames, counts


@st.composite
def blocks(draw):
    records = draw(st.lists(st.dictionaries(st.sampled_from(["text", "id", "n", "x"]), VALUES, max_size=4), max_size=12))
    fmt = draw(st.sampled_from(FORMATS))
    lines = [fmt(r) for r in records]
    if draw(st.booleans()):  # plain string texts only: the native path must read them all
        lines = [fmt({"text": draw(SAFE_TEXT), "id": i}) for i in range(draw(st.integers(1, 12)))]
        return lines, True
    for raw in draw(st.lists(st.sampled_from(RAW_LINES), max_size=3)):
        lines.insert(draw(st.integers(0, len(lines))), raw)
    if draw(st.booleans()):  # types known from a first good line: later faults meet the native reader
        lines.insert(0, b'{"text":"p","n":0.5}')
    return lines, False


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=blocks(), needed=st.sampled_from([("text",), ("text", "n"), ("n",), ()]), size=st.sampled_from([1, 64, 1 << 20]),
       skip=st.booleans())
def test_scan_equals_orjson_line_by_line(tmp_path, data, needed, size, skip):
    lines, plain = data
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    expected, bad = [], []
    for number, line in enumerate(lines, start=1):
        try:
            record = oracle(line)
        except ValueError:
            bad.append(number)
            continue
        if record is not None:
            expected.append((record, line.strip(b" \t\r") + b"\n"))  # the record path writes no whitespace around it
    if bad and not skip:
        with pytest.raises(BadRecordError) as raised:
            scan(path, needed, size)
        assert raised.value.line == bad[0]
        return
    frames, counts = scan(path, needed, size, "skip" if skip else "raise")
    native = [f for f in frames if f.parsed is None]  # before anything asks for records
    assert [typed(r) for f in frames for r in f.records()] == [typed(r) for r, _ in expected]
    assert b"".join(b"".join(f.lines.to_pylist()) for f in frames) == b"".join(line for _, line in expected)
    for name in needed:
        got = [v for f in frames for v in f.values(name)]
        assert [typed(v) for v in got] == [typed(r.get(name)) for r, _ in expected]
    if plain and needed == ("text",):
        assert counts.get(SCAN_FALLBACKS, 0) == 0 and len(native) == len(frames)
    if bad:
        assert counts.get(SCAN_FALLBACKS, 0) >= 1  # the fault landed: orjson read the block, and it was counted


@pytest.mark.parametrize("line, reason", [
    (b'{"text":"a","n":1}', "integral value"), (b'{"text":"a","x":1' + b"0" * 400 + b"}", "beyond a double"), (b'{"text":"a","x":' + b"[" * 1100 + b"]" * 1100 + b"}", "deep nesting"),
    (b'{"text":"a","text":"b"}', "specified twice"), (b'{"text":1}', "changed from string to number"),
    (b'{"text":"\\ud800x"}', "surrogate"), (b'{"text":"a","x":NaN}', "orjson refuses"), (b'{"text":"a","x":"\xff"}', "UTF-8"),
    (b'null', "does not start"), (b'{"text":"a"} {"text":"b"}', "several JSON documents"), (b'{"text":{"a":1}}', "changed from string to object"),
])
def test_a_block_the_native_reader_cannot_hold_exactly_is_parsed_by_orjson_and_told(tmp_path, caplog, line, reason):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b'{"text":"first","n":0.5}\n' + line + b"\n" + b'{"text":"z"}\n' * 3)
    with caplog.at_level(logging.WARNING, logger="zephyr"):
        frames, counts = scan(path, ("text", "n"), 1 << 20, "skip")
    assert counts[SCAN_FALLBACKS] == 1
    assert [r.get("text") for f in frames for r in f.records()][:1] == ["first"]
    told = [r.getMessage() for r in caplog.records if "native scan" in r.getMessage()]
    assert len(told) == 1 and str(path) in told[0] and reason in told[0], told
    assert any("1 block(s) of JSON lines" in line for line in engine_lines(counts))  # the run's summary says so


def test_records_are_parsed_from_the_lines_only_when_asked_for(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"".join(json.dumps({"text": f"t{i}", "big": 2**70 + i}).encode() + b"\n" for i in range(50)))
    frames, counts = scan(path, ("text",), 1 << 20)
    assert counts.get(SCAN_FALLBACKS, 0) == 0 and all(f.parsed is None for f in frames)
    assert frames[0].values("text")[:2] == ["t0", "t1"] and frames[0].parsed is None
    assert frames[0].base[3] == {"text": "t3", "big": 2**70 + 3}  # exact, parsed now


def docs(n, nulls):
    """Records with duplicate texts, unicode and big ints; with `nulls`, null and missing texts."""
    out = []
    for i in range(n):
        record = {"id": i, "text": ["same", "日本\u0000", f"t{i % 7}", None if nulls else "x"][i % 4], "big": 2**65 + i, "score": i / 3}
        if nulls and i % 11 == 0:
            del record["text"]
        out.append(record)
    return out


@pytest.mark.parametrize("pipeline, nulls", [("dedup", False), ("dedup", True), ("filter", True)])
def test_dedup_and_filter_equal_a_python_oracle_and_the_record_path(tmp_path, monkeypatch, pipeline, nulls):
    records = docs(300, nulls)
    source = tmp_path / "in.jsonl"
    source.write_text("".join(json.dumps(r) + "\n" for r in records))
    if pipeline == "dedup":
        seen, expected = set(), []
        for r in records:
            key = r.get("text")  # a null or missing text is one key, as in the record path
            if key not in seen:
                expected.append(r)
                seen.add(key)
    else:
        expected = [r for r in records if r.get("text") is not None and r["text"].startswith("t")]
    outputs = {}
    for columnar in ("1", "0"):
        monkeypatch.setenv("ZEPHYR_COLUMNAR", columnar)
        ds = Dataset.from_files([str(source)]).load_jsonl()
        ds = ds.deduplicate(col("text")) if pipeline == "dedup" else ds.filter(col("text").str_starts_with("t"))
        out = tmp_path / f"out-{columnar}"
        execution = create_backend("sync", progress=False, memory="4MiB", scratch_dir=str(tmp_path / f"s{columnar}")).execute(
            ds.write_jsonl(str(out / "part-{shard:05d}.jsonl")))
        list(execution)
        outputs[columnar] = [json.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
        if columnar == "1":
            assert execution.counters.get(SCAN_FALLBACKS, 0) == 0  # the native scan read every block
        if columnar == "1" and not (nulls and pipeline == "dedup"):  # (a null key takes the records: they are re-encoded)
            written = [line for p in sorted(out.glob("part-*.jsonl")) for line in p.read_bytes().splitlines()]
            assert set(written) <= set(source.read_bytes().splitlines()) and b'": ' in written[0]  # each its input line
    assert sorted(outputs["1"], key=lambda r: r["id"]) == sorted(outputs["0"], key=lambda r: r["id"])
    assert sorted(outputs["1"], key=lambda r: r["id"]) == expected


def test_odd_field_names_are_read_as_orjson_reads_them(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [b'{"a/b":"x","a.b":"y","":"z","a":{"b":"n"},"\xc3\xa9":"e"}', b'{"a/b":"x2"}']
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    frames, counts = scan(path, ("a/b", "a.b", "", "\u00e9"), 1 << 20)
    assert counts.get(SCAN_FALLBACKS, 0) == 0 and frames[0].parsed is None
    for name in ("a/b", "a.b", "", "\u00e9"):
        assert frames[0].df.get_column(name).to_list() == [orjson.loads(line).get(name) for line in lines]


def test_a_column_null_in_the_first_block_is_typed_by_the_next(tmp_path):
    path = tmp_path / "in.jsonl"
    lines = [b'{"text":null}'] * 20 + [b'{"text":"a"}'] * 20
    path.write_bytes(b"".join(line + b"\n" for line in lines))
    frames, counts = scan(path, ("text",), 100)
    assert counts.get(SCAN_FALLBACKS, 0) == 0 and len(frames) > 2
    assert [v for f in frames for v in f.values("text")] == [None] * 20 + ["a"] * 20
