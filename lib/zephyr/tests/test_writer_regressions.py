"""Named regressions for issue 21's "writers never change data, readers read exactly".

Each test pins one defect that existed before the fix, checked against values written out by
hand here (never against what the code printed).
"""

import gzip
import math

import orjson
import pytest
import zstandard

from zephyr import Dataset, ShardError, counters
from zephyr.io import BadRecordError, TruncatedInputError, UnwritableRecordError, read_jsonl, read_parquet
from zephyr.io.jsonl import write_jsonl_file
from zephyr.io.parquet import write_parquet_file
from zephyr.status import RECORD_NAME


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


@pytest.mark.parametrize("suffix, count", [(".zst", _zstd_frames), (".gz", _gzip_members)])
def test_our_compressed_output_is_one_frame_so_every_cut_is_detected(tmp_path, suffix, count):
    path = tmp_path / f"o.jsonl{suffix}"
    records = [{"i": i, "text": f"row {i} " * (i % 7)} for i in range(40_000)]  # several MB: many zstd blocks
    write_jsonl_file(records, str(path))
    data = path.read_bytes()
    assert count(data) == 1  # one frame: the only frame boundary is the end of the file
    cut = tmp_path / f"cut.jsonl{suffix}"
    step = max(1, len(data) // 300)
    for end in [*range(0, len(data), step), len(data) - 1]:
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
