"""Adversarial inputs for the engine's JSON-lines scan (issue 39): lines a real corpus may hold,
each read by the native scan (`zephyr.engine.scan.jsonl_frames`) and run end to end (dedup,
filter, with_columns, then write_jsonl) on both paths. The oracle is plain Python: orjson per
line decides what is a record (the record path's parser), the standard library's json gives the
values (integers beyond 64 bits exact, as the record path reads them). Each case also says
whether the native reader must take it (no fallback) or must hand the block to orjson."""

from __future__ import annotations

import gzip
import json
import os
import random
import struct

import orjson
import pytest
import zstandard

from zephyr import Dataset, col, counters, create_backend
from zephyr.engine.scan import SCAN_FALLBACKS, jsonl_frames
from zephyr.errors import ShardError
from zephyr.io.jsonl import BadRecordError

from lib.zephyr.tests.test_json_columns import typed

GOOD = b'{"text":"good","n":0.5}\n'  # types the columns first: a later fault meets the native reader
NATIVE, FALLBACK = "native", "fallback"


def oracle(data: bytes, skip: bool) -> list | None:
    """The records of a file as the record path reads them; None where it must raise."""
    lines = data.split(b"\n")
    if data.endswith(b"\n"):
        lines.pop()
    out = []
    for line in lines:
        if not line.strip():
            continue
        try:
            valid = type(orjson.loads(line)) is dict
        except orjson.JSONDecodeError:
            valid = False
        if not valid:
            if skip:
                continue
            return None
        out.append(json.loads(line))
    return out


def random_doubles(seed: int, n: int) -> list[float]:
    rng = random.Random(seed)
    values = (struct.unpack("d", rng.randbytes(8))[0] for _ in range(n))
    return [v for v in values if v == v and abs(v) != float("inf") and v != int(v)]  # integral: a fallback


DOUBLES = random_doubles(1, 400) + [0.1 + 0.2, 1e-7, 5e-324, 2.2250738585072014e-308, 1.5e-300, 123456.789]
ESCAPES = rb'{"text":"\/ \b \f \n \r \t \" \\ \u2028 \u0000 \u001f \ud83d\ude00 \u00e9 \uFEFF"}'
# (name, file bytes, needed columns, NATIVE or FALLBACK)
CASES = [
    ("escapes", GOOD + ESCAPES + b"\n", ("text",), NATIVE),
    ("raw 4-byte UTF-8", GOOD + '{"text":"😀 𝄞 日本 \u2028"}\n'.encode(), ("text",), NATIVE),
    ("key written with escapes", GOOD + rb'{"te\u0078t":"a"}' + b"\n" + rb'{"\u0074\u0065\u0078\u0074":"b"}' + b"\n", ("text",), NATIVE),
    ("key nested in another object", GOOD + b'{"meta":{"text":1},"text":"a","m2":{"x":{"text":[]}}}\n', ("text",), NATIVE),
    ("unneeded key given twice", GOOD + b'{"x":1,"x":2,"text":"a"}\n', ("text",), NATIVE),
    ("needed key given twice", GOOD + b'{"text":"a","text":"b"}\n', ("text",), FALLBACK),
    ("needed key twice, once escaped", GOOD + rb'{"text":"a","te\u0078t":"b"}' + b"\n", ("text",), FALLBACK),
    ("lone low surrogate", GOOD + rb'{"text":"\udc00"}' + b"\n", ("text",), FALLBACK),
    ("lone surrogate in an unneeded key", GOOD + rb'{"\ud800":1,"text":"a"}' + b"\n", ("text",), FALLBACK),
    ("CRLF line ends", b'{"text":"a"}\r\n{"text":"b"}\r\n', ("text",), NATIVE),
    ("last line without newline", b'{"text":"a"}\n{"text":"b"}', ("text",), NATIVE),
    ("BOM at file start", b'\xef\xbb\xbf{"text":"a"}\n{"text":"b"}\n', ("text",), FALLBACK),
    ("spaces after }", b'{"text":"a"}   \n{"text":"b"}\t\n', ("text",), NATIVE),
    ("blank and indented lines", GOOD + b'\n  \n \t{"text":"a"}\n\r\n\x0c\n', ("text",), NATIVE),
    ("NUL byte after }", GOOD + b'{"text":"a"}\x00\n' + GOOD, ("text",), FALLBACK),
    ("trailing comma", GOOD + b'{"text":"a","x":[1,]}\n', ("text",), FALLBACK),
    ("comment", GOOD + b'{"text":"a" /* c */}\n', ("text",), FALLBACK),
    ("leading zero in an unneeded number", GOOD + b'{"text":"a","x":01}\n', ("text",), FALLBACK),
    ("vertical tab as whitespace", GOOD + b'{"text":"a",\x0b"x":1}\n', ("text",), FALLBACK),
    ("1e400 unneeded", GOOD + b'{"text":"a","x":-1e400}\n', ("text",), FALLBACK),
    ("1e-400 unneeded (orjson: 0.0)", GOOD + b'{"text":"a","x":1e-400}\n', ("text",), NATIVE),
    ("1e-400 in a float column", GOOD + b'{"text":"a","n":1e-400}\n', ("text", "n"), NATIVE),
    ("-0.0 in a float column", GOOD + b'{"text":"a","n":-0.0}\n', ("text", "n"), NATIVE),
    ("1.8e308 in a float column (Arrow: inf)", GOOD + b'{"text":"a","n":1.8e308}\n', ("text", "n"), FALLBACK),
    ("1E5 in a float column", GOOD + b'{"text":"a","n":1E5}\n', ("text", "n"), NATIVE),
    ("integral floats", GOOD + b'{"n":1.0}\n{"n":-3.0}\n{"n":2e2}\n{"n":0.0}\n{"n":1e22}\n{"n":9007199254740993.0}\n', ("n",), NATIVE),
    ("2**64+1 in a float column", GOOD + b'{"n":18446744073709551617}\n', ("n",), FALLBACK),
    ("1e22, 1e19 written long, in a float column", GOOD + b'{"n":1e22}\n{"n":10000000000000000000.0}\n', ("n",), NATIVE),
    ("-0 in a float column", GOOD + b'{"text":"a","n":-0}\n', ("text", "n"), FALLBACK),
    ("1e2 then 100 in a float column", GOOD + b'{"n":1e2}\n{"n":100}\n', ("n",), FALLBACK),
    ("1 beside 1.0", GOOD + b'{"n":1.0}\n{"n":1}\n', ("n",), FALLBACK),
    ("subnormals", GOOD + b'{"n":5e-324}\n{"n":4.9e-324}\n{"n":2.4703282292062328e-324}\n', ("n",), NATIVE),
    ("random doubles by repr", b"".join(b'{"n":%r}\n' % v for v in DOUBLES), ("n",), NATIVE),
    ("random doubles by %.17g", b"".join(b'{"n":%.17g}\n' % v for v in DOUBLES), ("n",), NATIVE),
    ("random doubles by %.40e", b"".join(b'{"n":%.40e}\n' % v for v in DOUBLES), ("n",), NATIVE),
    ("int64 bounds", b'{"n":1}\n{"n":9223372036854775807}\n{"n":-9223372036854775808}\n', ("n",), NATIVE),
    ("2**63 in an int column", b'{"n":1}\n{"n":9223372036854775808}\n', ("n",), FALLBACK),
    ("-2**63-1 in an int column", b'{"n":1}\n{"n":-9223372036854775809}\n', ("n",), FALLBACK),
    ("2**64 in an int column", b'{"n":1}\n{"n":18446744073709551616}\n', ("n",), FALLBACK),
    ("big ints unneeded", GOOD + b'{"text":"a","b":18446744073709551616,"c":-9223372036854775809}\n', ("text",), NATIVE),
    ("1.0 in an int column", b'{"n":1}\n{"n":1.0}\n', ("n",), FALLBACK),
    ("true in an int column", b'{"n":1}\n{"n":true}\n', ("n",), FALLBACK),
    ("0 in a bool column", b'{"n":false}\n{"n":0}\n', ("n",), FALLBACK),
    ("{} in a string column", GOOD + b'{"text":{}}\n', ("text",), FALLBACK),
    ("[] in a string column", GOOD + b'{"text":[]}\n', ("text",), FALLBACK),
    ("needed column absent from the first 16 lines", b'{"x":1}\n' * 16 + b'{"text":"a"}\n', ("text",), FALLBACK),
    ("absent from the first 16 lines, then []", b'{"x":1}\n' * 16 + b'{"text":[]}\n', ("text",), FALLBACK),
    ("NaN and Infinity in a string", GOOD + b'{"text":"NaN Inf Infinity Information"}\n', ("text",), NATIVE),
    ("NaN unneeded", GOOD + b'{"text":"a","x":NaN}\n', ("text",), FALLBACK),
    ("NaN after a space", GOOD + b'{"text": "a", "x": NaN}\n', ("text",), FALLBACK),
    ("NaN first in a list", GOOD + b'{"text":"a","x":[NaN]}\n', ("text",), FALLBACK),
    ("-Infinity after a comma and tab", GOOD + b'{"text":"a","x":[1,\t-Infinity]}\n', ("text",), FALLBACK),
    ("NaN after 70 spaces", GOOD + b'{"text":"a","x":' + b" " * 70 + b"NaN}\n", ("text",), FALLBACK),
    ("NaN and Inf after : , [ in a string", GOOD + b'{"text":"Information: Inf, [NaN -Infinity"}\n', ("text",), NATIVE),
    ("-Infinity unneeded", GOOD + b'{"text":"a","x":-Infinity}\n', ("text",), FALLBACK),
    # Arrow's reader (RapidJSON, NaN/Inf allowed) also takes the bare token `Inf`, which orjson refuses:
    ("Inf unneeded", GOOD + b'{"text":"a","x":Inf}\n', ("text",), FALLBACK),
    ("-Inf unneeded, nested", GOOD + b'{"text":"a","x":[1,-Inf]}\n', ("text",), FALLBACK),
    ("a line cut short", GOOD + b'{"text":"a","x":\n' + GOOD, ("text",), FALLBACK),
    ("one object over two lines, two on one", GOOD + b'{"n":\n{"a":1},"text":"evil"}\n{"text":"c"} {"text":"d"}\n', ("text",), FALLBACK),
]


def scan(tmp_path, data, needed, size, skip):
    path = tmp_path / "in.jsonl"
    path.write_bytes(data)
    with counters.collecting() as counts:
        frames = list(jsonl_frames(str(path), "skip" if skip else "raise", size, frozenset(needed)))
        natives = [f.parsed is None for f in frames]  # before anything asks for records
        values = {name: [v for f in frames for v in f.values(name)] for name in needed}
        records = [r for f in frames for r in f.records()]
    return natives, values, records, counts.get(SCAN_FALLBACKS, 0)


@pytest.mark.parametrize("name, data, needed, expect", CASES, ids=[c[0] for c in CASES])
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "raise"])
def test_scan_gives_orjson_values_or_falls_back(tmp_path, name, data, needed, expect, skip):
    """Every column and record is the oracle's, exactly; the block is read natively or falls
    back as the case says; a line orjson refuses raises naming it (or is skipped)."""
    want = oracle(data, skip)
    if want is None:
        with pytest.raises(BadRecordError):
            scan(tmp_path, data, needed, 1 << 20, skip)
        return
    natives, values, records, fallbacks = scan(tmp_path, data, needed, 1 << 20, skip)
    assert [typed(r) for r in records] == [typed(r) for r in want]
    for column in needed:
        assert [typed(v) for v in values[column]] == [typed(r.get(column)) for r in want]
    if expect == NATIVE:
        assert fallbacks == 0 and all(natives)
    else:
        assert fallbacks >= 1 and not all(natives)


def run(tmp_path, columnar: str, source: str, build, skip: bool) -> tuple[list | None, Exception | None, dict]:
    out = tmp_path / f"out-{columnar}"
    os.environ["ZEPHYR_COLUMNAR"] = columnar
    backend = create_backend("sync", progress=False, memory="4MiB", scratch_dir=str(tmp_path / f"scratch-{columnar}"))
    try:
        execution = backend.execute(build(Dataset.from_files([source]).load_jsonl(on_bad_record="skip" if skip else "raise"))
                                    .write_jsonl(str(out / "part-{shard:05d}.jsonl")))
        list(execution)
    except ShardError as e:
        return None, e.__cause__, {}
    finally:
        backend.close()
        os.environ.pop("ZEPHYR_COLUMNAR", None)
    lines = [line for p in sorted(out.glob("part-*.jsonl")) for line in p.read_bytes().splitlines()]
    return [read_back(line) for line in lines], None, dict(execution.counters)


def read_back(line: bytes):
    orjson.loads(line)  # a line orjson refuses fails the test here
    return json.loads(line)


def first_per_key(records, key):
    seen, out = set(), []
    for r in records:
        k = repr(typed(r.get(key)))
        if k not in seen:
            seen.add(k)
            out.append(r)
    return out


PIPELINES = {
    "dedup": (lambda ds: ds.deduplicate(col("text")), lambda rs: first_per_key(rs, "text")),
    "filter": (lambda ds: ds.filter(col("text").is_not_null()), lambda rs: [r for r in rs if r.get("text") is not None]),
    "with_columns": (lambda ds: ds.with_columns(m=col("text").is_null()), lambda rs: [{**r, "m": r.get("text") is None} for r in rs]),
}
END_TO_END = [c for c in CASES if c[2] == ("text",)]


def check_end_to_end(tmp_path, source, data, pipeline, skip):
    """Both paths write the oracle's records (in any order), or both raise BadRecordError."""
    build, expected_of = PIPELINES[pipeline]
    want = oracle(data, skip)
    results = {c: run(tmp_path, c, source, build, skip) for c in ("0", "1")}
    for columnar, (records, error, _) in results.items():
        if want is None:
            assert isinstance(error, BadRecordError), (columnar, error)  # names the file and line
            assert f"{source}:" in str(error)
        else:
            assert error is None, (columnar, error)
            assert sorted(repr(typed(r)) for r in records) == sorted(repr(typed(r)) for r in expected_of(want)), columnar
    return results["1"][2]


@pytest.mark.slow  # 180 pipeline pairs, ~45 s
@pytest.mark.parametrize("name, data, needed, expect", END_TO_END, ids=[c[0] for c in END_TO_END])
@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "raise"])
def test_pipelines_equal_the_oracle_on_both_paths(tmp_path, name, data, needed, expect, pipeline, skip):
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    engine_counters = check_end_to_end(tmp_path, str(source), data, pipeline, skip)
    if engine_counters and expect == FALLBACK:
        assert engine_counters.get(SCAN_FALLBACKS, 0) >= 1  # the run says so


@pytest.mark.parametrize("pipeline", ["dedup", "filter"])
@pytest.mark.parametrize("skip", [True, False], ids=["skip", "raise"])
def test_an_object_split_over_two_lines_beside_a_line_of_two_is_refused(tmp_path, pipeline, skip):
    """A line cut short whose rest parses with the next line, and a line holding two objects,
    give Arrow as many rows as lines: the native scan once took such a block, its rows beside
    the wrong lines (a dedup wrote the broken lines; skip kept them). Now orjson reads it."""
    data = GOOD * 3 + b'{"n":\n{"a":1},"text":"evil"}\n{"text":"c"} {"text":"d"}\n'
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    engine_counters = check_end_to_end(tmp_path, str(source), data, pipeline, skip)
    assert not skip or engine_counters.get(SCAN_FALLBACKS, 0) == 1


@pytest.mark.parametrize("suffix", [".gz", ".zst"])
def test_compressed_input(tmp_path, suffix):
    data = b"".join(json.dumps({"i": i, "text": f"t{i % 10}", "u": "é😀"}).encode() + b"\n" for i in range(1000))
    source = tmp_path / f"in.jsonl{suffix}"
    source.write_bytes(gzip.compress(data) if suffix == ".gz" else zstandard.ZstdCompressor().compress(data))
    assert check_end_to_end(tmp_path, str(source), data, "dedup", skip=False).get(SCAN_FALLBACKS, 0) == 0


def test_a_line_longer_than_a_block(tmp_path):
    data = b"".join(json.dumps(r).encode() + b"\n" for r in [{"text": "x" * 3_000_000}, {"text": "y"}, {"text": "x" * 3_000_000}])
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    assert check_end_to_end(tmp_path, str(source), data, "dedup", skip=False).get(SCAN_FALLBACKS, 0) == 0


PAD = "p" * 200  # 6,000 lines of ~250 bytes: more than one 1 MiB block (memory="4MiB")


@pytest.mark.parametrize("second_block", [
    [{"text": "dup"}, {"text": "b"}, None],  # None: a needed key given twice, so the block falls back
    [{"text": "dup"}, {"text": 7}],  # an int among strings: the block falls back, its column held in Python
])
def test_dedup_across_a_native_block_and_a_fallback_block(tmp_path, second_block):
    """Equal keys, one in a block read natively and one in a block orjson read, are one key:
    the frame path and the record path put them in the same partition with the same bytes."""
    first = [{"i": i, "text": "dup" if i == 5 else f"a{i}", "pad": PAD} for i in range(6000)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in first)
    data += b"".join(b'{"text":"c","text":"d"}\n' if r is None else json.dumps({"i": 6000 + j, **r}).encode() + b"\n" for j, r in enumerate(second_block))
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    engine_counters = check_end_to_end(tmp_path, str(source), data, "dedup", skip=False)
    assert engine_counters.get(SCAN_FALLBACKS, 0) == 1 and engine_counters.get("zephyr/engine_blocks", 0) >= 2


def test_a_column_bool_in_one_block_and_int_in_the_next(tmp_path):
    records = [{"i": i, "text": i % 2 == 0, "pad": PAD} for i in range(6000)] + [{"i": 6000 + i, "text": i % 3} for i in range(30)]
    data = b"".join(json.dumps(r).encode() + b"\n" for r in records)
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    assert check_end_to_end(tmp_path, str(source), data, "dedup", skip=False).get(SCAN_FALLBACKS, 0) == 1


# Arrow's reader rounds a number just beyond the largest double down to it; orjson refuses it.
BEYOND_DOUBLE = b'{"text":"bad","x":17976931348623159e292}'


@pytest.mark.parametrize("before", [b'{"text":null}\n' * 5 + GOOD * 3, b'{"text":null}\r\n\n  \n' * 3 + b"  " + GOOD * 2],
                         ids=["plain", "blank and indented lines"])
def test_a_line_refused_only_when_its_record_is_parsed_is_named_by_file_and_line(tmp_path, before):
    """A line the native scan takes and orjson refuses fails when a Python op asks for its
    record: the error names the file and that line, counted after rows a filter dropped and
    blank lines skipped."""
    data = before + BEYOND_DOUBLE + b"\n" + GOOD
    number = data.split(b"\n").index(BEYOND_DOUBLE) + 1
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    with counters.collecting() as counts:
        frames = list(jsonl_frames(str(source), "raise", 1 << 20, frozenset({"text"})))
    assert counts.get(SCAN_FALLBACKS, 0) == 0 and frames  # the fault lands lazily: the scan took the line
    records, error, _ = run(tmp_path, "1", str(source), lambda ds: ds.filter(col("text").is_not_null()).map(lambda r: r), False)
    assert isinstance(error, BadRecordError) and (error.path, error.line) == (str(source), number), error
    assert f"{source}:{number}:" in str(error)


def written(tmp_path, columnar: str) -> bytes:
    return b"".join(p.read_bytes() for p in sorted((tmp_path / f"out-{columnar}").glob("part-*.jsonl")))


def compact(i: int) -> bytes:
    return orjson.dumps({"i": i, "text": f"t{i % 3}"})


CRLF = b"".join(compact(i) + b"\r\n" for i in range(20))


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("data", [CRLF, CRLF + b'{"i":20,"text":7}\r\n'], ids=["native", "fallback"])
def test_crlf_lines_are_written_as_the_record_path_writes_them(tmp_path, pipeline, data):
    """A CRLF file's rows are written with "\\n" endings, the record path's bytes, whether the
    block was read natively or fell back."""
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    engine_counters = check_end_to_end(tmp_path, str(source), data, pipeline, skip=False)
    assert written(tmp_path, "1") == written(tmp_path, "0") and b"\r" not in written(tmp_path, "1")
    assert (engine_counters.get(SCAN_FALLBACKS, 0) == 0) == (data == CRLF)  # each case ran the path it names


def spaced(fmt) -> bytes:
    """Blank lines (one of a form feed) and lines with whitespace around their JSON."""
    lines = [b" \t", b""] + [b" " * (i % 3) + fmt(i) + b" \t\r"[: i % 4] for i in range(20)] + [b"\x0c", b"\r"]
    return b"\n".join(lines[:5] + [b""] + lines[5:]) + b"\n"


@pytest.mark.parametrize("pipeline", sorted(PIPELINES))
@pytest.mark.parametrize("fmt", [compact, lambda i: json.dumps({"i": i, "text": f"t{i % 3}"}).encode()], ids=["compact", "json.dumps"])
def test_blank_and_padded_lines_are_read_natively_as_the_record_path_reads_them(tmp_path, pipeline, fmt):
    data = spaced(fmt)
    source = tmp_path / "in.jsonl"
    source.write_bytes(data)
    assert check_end_to_end(tmp_path, str(source), data, pipeline, skip=False).get(SCAN_FALLBACKS, 0) == 0
    if fmt is compact:
        assert written(tmp_path, "1") == written(tmp_path, "0")
