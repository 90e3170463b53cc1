"""JSONL and Parquet round trips, compression by extension, determinism, gs:// and memory://."""

import gzip
import json
import re

import fsspec
import pyarrow as pa
import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, ShardError, create_backend
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output

RECORDS = [{"id": i, "text": f"document {i}", "score": i / 7} for i in range(50)]


def write_and_read(backend, pattern, writer="jsonl", loader="load_jsonl"):
    ds = Dataset.from_list([RECORDS[:25], RECORDS[25:]]).flat_map(lambda batch: batch)
    ds = ds.write_jsonl(pattern) if writer == "jsonl" else ds.write_parquet(pattern)
    paths = list(backend.execute(ds))
    back = list(backend.execute(getattr(Dataset.from_list(paths), loader)()))
    return paths, back


@pytest.mark.parametrize("ext", [".jsonl", ".jsonl.gz", ".jsonl.zst", ".jsonl.zstd"])
def test_jsonl_round_trip_with_compression(backend, tmp_path, ext):
    paths, back = write_and_read(backend, str(tmp_path / f"part-{{shard:03d}}-of-{{total:03d}}{ext}"))
    assert paths == [str(tmp_path / f"part-000-of-002{ext}"), str(tmp_path / f"part-001-of-002{ext}")]
    assert back == RECORDS


def test_compression_really_follows_the_extension(tmp_path, local_backend):
    write_and_read(local_backend, str(tmp_path / "a-{shard}.jsonl.gz"))
    write_and_read(local_backend, str(tmp_path / "b-{shard}.jsonl.zst"))
    write_and_read(local_backend, str(tmp_path / "c-{shard}.jsonl"))
    assert (tmp_path / "a-0.jsonl.gz").read_bytes()[:2] == b"\x1f\x8b"
    assert (tmp_path / "b-0.jsonl.zst").read_bytes()[:4] == b"\x28\xb5\x2f\xfd"
    assert (tmp_path / "c-0.jsonl").read_bytes().startswith(b'{"id":0')
    # readable by the standard tools of each format
    assert gzip.decompress((tmp_path / "a-0.jsonl.gz").read_bytes()).count(b"\n") == 25
    assert zstandard.ZstdDecompressor().stream_reader((tmp_path / "b-0.jsonl.zst").open("rb")).read().count(b"\n") == 25


def test_parquet_round_trip_and_columns(backend, tmp_path):
    paths, back = write_and_read(backend, str(tmp_path / "p-{shard}.parquet"), writer="parquet", loader="load_parquet")
    assert back == RECORDS
    only = list(backend.execute(Dataset.from_list(paths).load_parquet(columns=["id"])))
    assert only == [{"id": r["id"]} for r in RECORDS]


def test_parquet_with_explicit_schema(tmp_path, local_backend):
    schema = pa.schema([("id", pa.int32()), ("text", pa.string())])
    ds = Dataset.from_iterable({"id": i, "text": str(i)} for i in range(5)).write_parquet(str(tmp_path / "s.parquet"), schema=schema)
    [path] = list(local_backend.execute(ds))
    import pyarrow.parquet as pq

    assert pq.read_schema(path).field("id").type == pa.int32()


def test_load_file_picks_the_reader_by_extension(tmp_path, local_backend):
    write_and_read(local_backend, str(tmp_path / "j-{shard}.jsonl.zst"))
    write_and_read(local_backend, str(tmp_path / "q-{shard}.parquet"), writer="parquet", loader="load_parquet")
    ds = Dataset.from_files([str(tmp_path / "j-*.jsonl.zst"), str(tmp_path / "q-*.parquet")]).load_file()
    assert list(local_backend.execute(ds)) == RECORDS + RECORDS


def test_from_files_is_sorted_one_shard_per_file(tmp_path, local_backend):
    for name in ["c.jsonl", "a.jsonl", "b.jsonl"]:
        (tmp_path / name).write_text(f'{{"name": "{name}"}}\n')
    ds = Dataset.from_files(str(tmp_path / "*.jsonl"))
    assert ds.plan().num_shards == 3
    assert [r["name"] for r in local_backend.execute(ds.load_jsonl())] == ["a.jsonl", "b.jsonl", "c.jsonl"]


@pytest.mark.parametrize("base", ["local", "memory://brackets-in-names"])
def test_a_listed_file_whose_name_holds_brackets_is_read(tmp_path, local_backend, base):
    """Regression: `from_files(["page[1].jsonl"])` raised "matched no files" though the file
    exists ("[1]" is a character class); a pattern whose wildcards match nothing now names the
    file as written, as a shell does, and the error for a glob says how to escape "[". """
    root = str(tmp_path) if base == "local" else base
    fs, _ = fsspec.core.url_to_fs(root)
    named = f"{root}/in [1]/page[1].jsonl"
    fs.mkdirs(fs._strip_protocol(f"{root}/in [1]"), exist_ok=True)
    fs.pipe_file(fs._strip_protocol(named), b'{"page": 1}\n')
    try:
        assert list(local_backend.execute(Dataset.from_files([named]).load_jsonl())) == [{"page": 1}]
        assert list(local_backend.execute(Dataset.from_files(f"{root}/in [[]1]/*.jsonl").load_jsonl())) == [{"page": 1}]
        with pytest.raises(FileNotFoundError, match=re.escape("matched no files ('[' starts a character class: write '[[]'")):
            Dataset.from_files(f"{root}/in [1]/*.jsonl").plan()
    finally:
        if base != "local":
            fs.rm(fs._strip_protocol(base), recursive=True)


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_same_input_same_bytes(tmp_path, backend_name):
    outputs = []
    for run in range(2):
        b = create_backend(backend_name, progress=False)
        ds = Dataset.from_list([RECORDS[:10], RECORDS[10:]]).flat_map(list)
        for ext in ("jsonl.gz", "jsonl.zst", "parquet"):
            pattern = str(tmp_path / f"run{run}" / f"out-{{shard}}.{ext}")
            list(b.execute(ds.write_parquet(pattern) if ext == "parquet" else ds.write_jsonl(pattern)))
        outputs.append({p.name: p.read_bytes() for p in sorted((tmp_path / f"run{run}").iterdir()) if p.name != RECORD_NAME})
    assert outputs[0] == outputs[1]
    assert len(outputs[0]) == 6


def test_same_bytes_on_every_backend(backend, tmp_path, local_backend):
    ds = Dataset.from_list([RECORDS[:10], RECORDS[10:]]).flat_map(list).map(lambda r: {**r, "len": len(r["text"])})
    ref = list(local_backend.execute(ds.write_jsonl(str(tmp_path / "ref-{shard}.jsonl.zst"))))
    got = list(backend.execute(ds.write_jsonl(str(tmp_path / f"{backend.name}-{{shard}}.jsonl.zst"))))
    assert [open(p, "rb").read() for p in got] == [open(p, "rb").read() for p in ref]


def test_gs_paths_through_a_real_gcs_api(backend, gcs_bucket):
    src = f"{gcs_bucket}/raw"
    for i in range(3):
        with fsspec.open(f"{src}/part-{i}.jsonl.zst", "wb", compression="zstd") as f:
            f.write(b"".join(b'{"i": %d, "part": %d}\n' % (j, i) for j in range(4)))
    ds = Dataset.from_files(f"{src}/*.jsonl.zst").load_jsonl().filter(lambda r: r["i"] % 2 == 0)
    paths = list(backend.execute(ds.write_jsonl(f"{gcs_bucket}/out/{{shard:05d}}.jsonl.gz")))
    assert paths == [f"{gcs_bucket}/out/{i:05d}.jsonl.gz" for i in range(3)]
    back = list(backend.execute(Dataset.from_files(f"{gcs_bucket}/out/*.jsonl.gz").load_jsonl()))
    assert back == [{"i": j, "part": i} for i in range(3) for j in (0, 2)]
    fs = fsspec.filesystem("gs")
    fs.invalidate_cache()
    assert sorted(p.rsplit("/", 1)[-1] for p in fs.ls(f"{gcs_bucket}/out")) == [RECORD_NAME] + [f"{i:05d}.jsonl.gz" for i in range(3)]


def test_memory_filesystem(local_backend):
    ds = Dataset.from_iterable(RECORDS).write_parquet("memory://zephyr-test/out.parquet")
    assert list(local_backend.execute(ds)) == ["memory://zephyr-test/out.parquet"]
    assert list(local_backend.execute(Dataset.from_files("memory://zephyr-test/*.parquet").load_parquet())) == RECORDS


def test_parquet_keeps_a_column_first_seen_after_the_first_batch(tmp_path, local_backend):
    """Regression: a key first seen after the first 8,192 rows was silently dropped (it was
    then refused; it is now written, null in the rows that lack it)."""
    rows = [{"a": i} for i in range(8192)] + [{"a": 1, "b": "late"}]
    list(local_backend.execute(Dataset.from_iterable(rows).write_parquet(str(tmp_path / "x.parquet"))))
    back = list(local_backend.execute(Dataset.from_list([str(tmp_path / "x.parquet")]).load_parquet()))
    assert back == [{"a": i, "b": None} for i in range(8192)] + [{"a": 1, "b": "late"}]


def test_parquet_refuses_columns_outside_a_given_schema(tmp_path, local_backend):
    import pyarrow as pa

    rows = [{"a": i} for i in range(8192)] + [{"a": 1, "b": "late"}]
    ds = Dataset.from_iterable(rows).write_parquet(str(tmp_path / "x.parquet"), schema=pa.schema([("a", pa.int64())]))
    with pytest.raises(ShardError, match=r"record 8192, field 'b': column\(s\) \['b'\] are not in the given Parquet schema"):
        list(local_backend.execute(ds))
    assert not (tmp_path / "x.parquet").exists()


def test_overlapping_patterns_read_each_file_once(tmp_path, local_backend):
    for name in ("1.jsonl", "2.jsonl"):
        (tmp_path / name).write_text(f'{{"f": "{name}"}}\n')
    ds = Dataset.from_files([str(tmp_path / "*.jsonl"), str(tmp_path / "1.jsonl")]).load_jsonl()
    assert [r["f"] for r in local_backend.execute(ds)] == ["1.jsonl", "2.jsonl"]
    with pytest.raises(FileNotFoundError, match="Input file .*missing.jsonl' does not exist"):
        Dataset.from_files([str(tmp_path / "missing.jsonl")], empty_glob_ok=True).plan()


def test_rerun_of_a_finished_shuffle_on_memory_fs_does_no_work(local_backend):
    """Regression: memory:// listings came back as memory:///..., so the all-outputs-exist check failed."""
    ds = Dataset.from_list([[{"x": 1}, {"x": 2}], [{"x": 2}, {"x": 3}]]).flat_map(list).deduplicate(lambda r: r["x"], num_output_shards=2)
    ds = ds.write_jsonl("memory://rerun-check/out-{shard}.jsonl", skip_existing=True)
    list(local_backend.execute(ds))
    again = local_backend.execute(ds)
    list(again)
    assert again.counters["zephyr/stages_skipped_outputs_exist"] == 1


@pytest.mark.parametrize("block", [7, 64, 1 << 18])
def test_jsonl_reader_blocks_keep_every_line_and_its_number(tmp_path, monkeypatch, block):
    """read_jsonl decodes a block of lines at a time: lines across block edges, a line longer
    than a block, blank lines, a last line without newline, and bad lines far into the file
    (reported by their own number) all behave as line by line."""
    from zephyr import counters
    from zephyr.io import jsonl

    monkeypatch.setattr(jsonl, "_BLOCK", block)
    lines = [b'{"i": %d, "t": "%s"}' % (i, b"x" * (i % 50)) for i in range(300)]
    lines[40] = b'{"long": "' + b"y" * 5000 + b'"}'
    lines[100] = b"   "
    lines[101] = b""
    path = tmp_path / "a.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines)))  # no trailing newline
    expected = [orjson_loads(line) for line in lines if line.strip()]
    assert list(jsonl.read_jsonl(str(path))) == expected

    lines[250] = b'{"i": '
    lines[260] = b"\xff"
    path.write_bytes(zstandard.ZstdCompressor().compress(b"\n".join(lines) + b"\n"))
    with pytest.raises(jsonl.BadRecordError, match=r"a.jsonl.zst:251: malformed JSON"):
        list(jsonl.read_jsonl(str(path)))
    plain = tmp_path / "b.jsonl"
    plain.write_bytes(b"\n".join(lines) + b"\n")
    with counters.collecting() as seen:
        kept = list(jsonl.read_jsonl(str(plain), on_bad_record="skip"))
    assert kept == [orjson_loads(line) for i, line in enumerate(lines) if line.strip() and i not in (250, 260)]
    assert seen["zephyr/bad_records"] == 2
    assert seen["zephyr/bytes_read"] == plain.stat().st_size


def orjson_loads(line: bytes):
    import orjson

    return orjson.loads(line)


@settings(max_examples=500, deadline=None)
@given(data=st.lists(st.one_of(st.sampled_from([b"0", b"9", b"5", b"/", b":", b" ", b"a"]), st.binary(max_size=3),
                               st.integers(0, 10**25).map(lambda i: str(i).encode())), max_size=80).map(b"".join))
def test_the_long_digit_scan_finds_exactly_the_runs_of_19_digits(data):
    """`_long_digits` (a strided sample, then an exact look where two samples are digits)
    against a plain regex: where it misses a run, an integer beyond 64 bits is read as a float."""
    from zephyr.io.jsonl import _long_digits

    for text in (data, b"x" * 50 + data, data * 3):
        assert _long_digits(text) == (re.search(rb"[0-9]{19}", text) is not None)


def test_integers_beyond_64_bits_are_read_exactly_anywhere_in_a_block(tmp_path):
    """A 19-to-25-digit integer at each offset of a long block reads back as the int written
    (orjson alone would give a float), and a block of short numbers reads as orjson reads it."""
    from zephyr.io import read_jsonl

    rows = [{"pad": "x" * (i % 23), "n": 10**18 + i * 7919 if i % 2 else 10**24 + i, "m": -(2**64) - i} for i in range(400)]
    path = tmp_path / "big.jsonl"
    path.write_bytes(b"".join(json.dumps(r, separators=(",", ":")).encode() + b"\n" for r in rows))
    assert list(read_jsonl(str(path))) == rows


def test_parquet_holds_uint64_values(tmp_path, local_backend, monkeypatch):
    """64-bit hashes and ids (2**63 and up) are written as uint64, widening earlier int64 row
    groups when they first appear after 8,192 rows, and a Parquet -> Parquet copy keeps them
    on both paths (it was refused as "beyond int64"). Negative ints beside them, and ints past
    uint64, are refused by name."""
    import pyarrow.parquet as pq

    from zephyr.io import UnwritableRecordError

    rows = [{"h": i} for i in range(8192)] + [{"h": 2**64 - 1}, {"h": 2**63}, {"h": None}]
    src = str(tmp_path / "src.parquet")
    list(local_backend.execute(Dataset.from_iterable(rows).write_parquet(src)))
    assert pq.read_schema(src).field("h").type == pa.uint64()
    assert pq.read_table(src).column("h").to_pylist() == [r["h"] for r in rows]
    copies = {}
    for columnar in ("1", "0"):
        monkeypatch.setenv("ZEPHYR_COLUMNAR", columnar)
        out = str(tmp_path / f"copy-{columnar}.parquet")
        list(local_backend.execute(Dataset.from_list([src]).load_parquet().filter(lambda r: True).write_parquet(out)
                                   if columnar == "0" else Dataset.from_list([src]).load_parquet().write_parquet(out)))
        copies[columnar] = pq.read_table(out)
    assert copies["1"].equals(copies["0"]) and copies["1"].column("h").to_pylist() == [r["h"] for r in rows]
    for bad, record in (([{"h": -1}, {"h": 2**63}], 1), ([{"h": 2**63}] * 9000 + [{"h": -5}], 9000), ([{"h": 2**64}], 0)):
        with pytest.raises(ShardError) as info:
            list(local_backend.execute(Dataset.from_iterable(bad).write_parquet(str(tmp_path / "bad.parquet"))))
        error = info.value.__cause__
        assert isinstance(error, UnwritableRecordError) and error.field == "h" and f"record {record}," in str(error), error
        assert not (tmp_path / "bad.parquet").exists()
