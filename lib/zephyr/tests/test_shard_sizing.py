"""Shards sized by bytes (issue 41): `approx_shard_bytes` packs small files and cuts large ones.

Every oracle reads the files apart from zephyr: `json.loads` of each line of the whole file,
the records as the test wrote them, a greedy packing checked by its properties (in order, within
the target, no two neighbours that would fit together).
"""

from __future__ import annotations

import gzip
import json
import os
import random
from pathlib import Path

import fsspec
import gcsfs
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from zephyr import Dataset, col, create_backend
from zephyr.errors import PlanError
from zephyr.execution.provenance import SIDECAR_SUFFIX
from zephyr.io.jsonl import BadRecordError, read_jsonl
from zephyr.io.warc import UncuttableWarcError, read_warc, write_warc_file
from zephyr.plan.sizing import FILE_COST
from zephyr.plan.sources import ByteRange
from zephyr.status import RECORD_NAME

LOCAL_FILE = FILE_COST["local"]  # what packing counts a local file as beyond its bytes


def lines_of(path: Path) -> list[dict]:
    """The oracle: every non-blank line of the whole file, parsed by the standard library."""
    return [json.loads(line) for line in path.read_bytes().split(b"\n") if line.strip()]


def write_lines(path: Path, records: list[dict], *, blank_every: int = 0, final_newline: bool = True) -> Path:
    lines = []
    for i, record in enumerate(records):
        if blank_every and i % blank_every == 0:
            lines.append("")
        lines.append(json.dumps(record))
    path.write_text("\n".join(lines) + ("\n" if final_newline else ""))
    return path


def ragged(n: int, seed: int = 0, start: int = 0) -> list[dict]:
    """Records of very different lengths: some lines far longer than others (and than a span)."""
    rng = random.Random(seed)
    return [{"i": start + i, "t": "x" * rng.choice([0, 1, 5, 40, 300, 2000])} for i in range(n)]


def ids(records) -> list[int]:
    return [r["i"] for r in records]


@pytest.fixture
def sync():
    b = create_backend("sync", progress=False)
    yield b
    b.close()


# ---- JSON Lines: byte spans on line boundaries ----------------------------------------------------


def test_every_cut_point_gives_each_line_to_exactly_one_span(tmp_path):
    path = write_lines(tmp_path / "a.jsonl", ragged(12, seed=1), blank_every=5, final_newline=False)
    expected = lines_of(path)
    size = path.stat().st_size
    for cut in range(size + 1):  # at a line start, on a newline, mid-line, at both ends
        left = list(read_jsonl(str(path), span=(0, cut)))
        right = list(read_jsonl(str(path), span=(cut, size)))
        assert left + right == expected, f"cut at byte {cut}"
    three = [list(read_jsonl(str(path), span=(a, b))) for a, b in ((0, 700), (700, 701), (701, size))]
    assert sum(three, []) == expected


@pytest.mark.parametrize("target", [61, 700, 5000, 10**9])
def test_a_pipeline_reads_every_record_once_whatever_the_target(tmp_path, sync, target):
    big = write_lines(tmp_path / "big.jsonl", ragged(300, seed=2), blank_every=7)
    smalls = [write_lines(tmp_path / f"s{k:02d}.jsonl", ragged(2, seed=k, start=1000 + 2 * k)) for k in range(20)]
    expected = ids(sum((lines_of(p) for p in [big, *smalls]), []))  # sorted names: big.jsonl first
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(approx_shard_bytes=target)
    assert ids(sync.execute(ds.map(lambda r: r))) == expected  # records in Python
    assert ids(sync.execute(ds.filter(col("i") >= 0))) == expected  # the engine's JSON scan
    threadpool = create_backend("threadpool", max_parallelism=4, progress=False)
    try:
        assert ids(threadpool.execute(ds)) == expected
    finally:
        threadpool.close()


@pytest.mark.ray
def test_spans_and_packed_shards_run_on_ray(tmp_path, ray_shared):
    big = write_lines(tmp_path / "big.jsonl", ragged(200, seed=3))
    smalls = [write_lines(tmp_path / f"s{k}.jsonl", ragged(3, seed=k, start=500 + 3 * k)) for k in range(6)]
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(approx_shard_bytes=8000)
    assert len(ds.plan().stages[0].input) > 3
    backend = create_backend("ray", max_parallelism=4, progress=False)
    try:
        assert ids(backend.execute(ds)) == ids(sum((lines_of(p) for p in [big, *smalls]), []))
    finally:
        backend.close()


def test_a_bad_line_in_a_span_is_named_by_the_span_and_its_line_there(tmp_path, sync):
    records = ragged(200, seed=4)
    text = "".join(json.dumps(r) + "\n" for r in records)
    bad_at = text.index('{"i": 150,')
    path = tmp_path / "a.jsonl"
    path.write_text(text[:bad_at] + "{not json\n" + text[bad_at:])
    ds = Dataset.from_files(str(path)).load_jsonl(approx_shard_bytes=len(text) // 4)
    span = next(s.items[0] for s in ds.plan().stages[0].input if s.items[0].start <= bad_at < s.items[0].end)
    with pytest.raises(Exception, match=rf"a.jsonl \[bytes {span.start}-{span.end}\]:(\d+): malformed JSON") as caught:
        list(sync.execute(ds))
    line = int(str(caught.value).split(f"{span.end}]:")[1].split(":")[0])
    # the oracle: count lines from the first that starts at or after the span's start
    data = path.read_bytes()
    first = span.start if span.start == 0 or data[span.start - 1] == ord("\n") else data.index(b"\n", span.start) + 1
    assert data[first:].split(b"\n")[line - 1] == b"{not json"
    with pytest.raises(BadRecordError):
        list(read_jsonl(str(path), span=(span.start, span.end)))


def test_compressed_json_lines_are_packed_never_cut(tmp_path, sync):
    big = [{"i": i, "t": os.urandom(200).hex()} for i in range(1000)]  # ~400 KB that zstd cannot shrink
    (tmp_path / "big.jsonl.zst").write_bytes(zstandard.ZstdCompressor().compress("".join(json.dumps(r) + "\n" for r in big).encode()))
    (tmp_path / "c.jsonl.gz").write_bytes(gzip.compress(b'{"i": 9001}\n'))
    (tmp_path / "d.jsonl.gz").write_bytes(gzip.compress(b'{"i": 9002}\n'))
    target = 3 * LOCAL_FILE
    assert (tmp_path / "big.jsonl.zst").stat().st_size > target
    ds = Dataset.from_files(str(tmp_path / "*.gz")).load_jsonl(approx_shard_bytes=target)
    assert [s.items for s in ds.plan().stages[0].input] == [(str(tmp_path / "c.jsonl.gz"), str(tmp_path / "d.jsonl.gz"))]
    whole = Dataset.from_files(str(tmp_path / "*")).load_jsonl(approx_shard_bytes=target)
    assert "1 larger kept whole (compressed JSON Lines)" in whole.describe()
    assert ids(sync.execute(whole)) == ids(big) + [9001, 9002]
    with pytest.raises(ValueError, match="a compressed file cannot be read from byte 5"):
        list(read_jsonl(str(tmp_path / "c.jsonl.gz"), span=(5, 10)))


# ---- packing ----------------------------------------------------------------------------------------


def test_small_files_are_packed_in_order_within_the_target(tmp_path, sync):
    rng = random.Random(6)
    paths = [write_lines(tmp_path / f"f{k:03d}.jsonl", [{"i": 10 * k + j, "t": "x" * rng.randint(0, 400)} for j in range(rng.randint(0, 4))])
             for k in range(60)]
    target = 4 * LOCAL_FILE  # above every file's size: all packed, none cut
    pattern = str(tmp_path / "f*.jsonl")
    shards = Dataset.from_files(pattern).load_jsonl(approx_shard_bytes=target).plan().stages[0].input
    again = Dataset.from_files([str(p) for p in reversed(paths)]).load_jsonl(approx_shard_bytes=target).plan().stages[0].input
    assert [s.items for s in shards] == [s.items for s in again]  # deterministic, whatever order the patterns list
    assert [p for s in shards for p in s.items] == [str(p) for p in paths]  # every file once, in sorted order
    cost = {str(p): p.stat().st_size + LOCAL_FILE for p in paths}  # a file's bytes and the cost of opening it
    for shard, after in zip(shards, shards[1:] + (None,)):
        total = sum(cost[p] for p in shard.items)
        assert total <= target or len(shard.items) == 1
        if after is not None:  # greedy: the next file did not fit
            assert total + cost[after.items[0]] > target
    assert 1 < len(shards) < len(paths)
    assert ids(sync.execute(Dataset.from_files(pattern).load_jsonl(approx_shard_bytes=target))) == ids(
        sum((lines_of(p) for p in paths), []))


def test_listed_paths_are_sized_too(tmp_path, sync):
    big = write_lines(tmp_path / "big.jsonl", [{"i": i, "t": "x" * 900} for i in range(1000)])  # ~900 KB
    smalls = [write_lines(tmp_path / f"s{k}.jsonl", [{"i": 100 + k}]) for k in range(3)]
    paths = [str(p) for p in [big, *smalls]]
    target = big.stat().st_size // 2 + 1
    assert target > 3 * (LOCAL_FILE + 20)
    for source in (Dataset.from_list(paths), Dataset.from_iterable(paths)):
        ds = source.load_jsonl(approx_shard_bytes=target)
        assert [len(s.items) for s in ds.plan().stages[0].input] == [1, 1, 3]
        assert ids(sync.execute(ds)) == list(range(1000)) + [100, 101, 102]


def test_the_plan_shows_the_packing(tmp_path):
    write_lines(tmp_path / "big.jsonl", [{"i": i, "t": "x" * 1000} for i in range(1200)])  # ~1.2 MB
    for k in range(5):
        write_lines(tmp_path / f"s{k}.jsonl", [{"i": k}])
    size = (tmp_path / "big.jsonl").stat().st_size
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(approx_shard_bytes=size // 3 + 1)
    text = ds.describe()
    assert "6 files" in text and "5 packed into 1 shard;" in text and "1 cut into 3 pieces" in text
    assert "a file counting 64.0 KiB more" in text
    assert "load_jsonl(approx_shard_bytes=" in text and "[4 shards]" in text
    labels = [s.label for s in ds.plan().stages[0].input]
    assert labels[0] == f"{tmp_path}/big.jsonl [bytes 0-{size // 3}]"
    assert labels[-1].startswith(f"5 files (") and labels[-1].endswith(f"{tmp_path}/s0.jsonl .. {tmp_path}/s4.jsonl")


def test_basename_is_refused_when_shards_are_sized(tmp_path):
    write_lines(tmp_path / "a.jsonl", [{"i": 1}])
    ds = Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(approx_shard_bytes=1 << 20)
    with pytest.raises(PlanError, match=r"uses \{basename\}, but approx_shard_bytes=1048576 sizes shards by bytes.*use \{shard\}"):
        ds.write_jsonl(str(tmp_path / "out/{basename}.jsonl")).plan()
    with pytest.raises(PlanError, match="must directly follow the source"):
        Dataset.from_files(str(tmp_path / "*.jsonl")).filter(bool).load_jsonl(approx_shard_bytes=10).plan()
    with pytest.raises(ValueError, match="approx_shard_bytes must be a positive integer"):
        Dataset.from_files(str(tmp_path / "*.jsonl")).load_warc(approx_shard_bytes=0)


def test_include_file_paths_names_the_file_of_a_span(tmp_path, sync):
    path = write_lines(tmp_path / "a.jsonl", ragged(50, seed=8))
    ds = Dataset.from_files(str(path)).load_jsonl(include_file_paths=True, approx_shard_bytes=500)
    assert isinstance(ds.plan().stages[0].input[1].items[0], ByteRange)
    assert {r["__file_path"] for r in sync.execute(ds)} == {str(path)}


# ---- Parquet and WARC -----------------------------------------------------------------------------


def test_parquet_small_files_packed_and_a_large_one_cut_at_row_groups(tmp_path, sync):
    texts = [os.urandom(100).hex() for _ in range(4000)]  # ~800 KB that no codec shrinks
    pq.write_table(pa.table({"i": list(range(4000)), "t": texts}), tmp_path / "a.parquet", row_group_size=500)
    for k in range(4):
        pq.write_table(pa.table({"i": [5000 + k], "t": ["small"]}), tmp_path / f"b{k}.parquet")
    target = 4 * (LOCAL_FILE + 1000)
    assert (tmp_path / "a.parquet").stat().st_size > 2 * target
    ds = Dataset.from_files(str(tmp_path / "*.parquet")).load_parquet(approx_shard_bytes=target)
    shards = ds.plan().stages[0].input
    assert all("row group" in s.label for s in shards[:-1]) and len(shards[-1].items) == 4
    assert ids(sync.execute(ds)) == list(range(4000)) + [5000, 5001, 5002, 5003]


def warc_records(n: int, *, fake_header_in: int | None = None) -> list[dict]:
    records = [{"url": f"http://example.com/{i}", "content": b"<p>page %d</p>" % i * (1 + i % 40), "date": "2024-01-01T00:00:00Z"}
               for i in range(n)]
    if fake_header_in is not None:  # a page that shows a WARC record, header and all
        fake = b"WARC/1.1\r\nWARC-Type: response\r\nContent-Length: 5\r\nWARC-Target-URI: http://fake/\r\n\r\nhello\r\n\r\n"
        records[fake_header_in]["content"] = b"x" * 3000 + fake + b"y" * 3000
    return records


@pytest.mark.parametrize("name", ["crawl.warc", "crawl.warc.gz"])
def test_warc_spans_give_each_record_to_one_span(tmp_path, name):
    records = warc_records(60)
    path = tmp_path / name
    write_warc_file(records, str(path))
    size = path.stat().st_size
    for cut in range(0, size + 1, 97):
        got = [r["url"] for span in ((0, cut), (cut, size)) for r in read_warc(str(path), span=span)]
        assert got == [r["url"] for r in records], f"cut at byte {cut}"


def test_warc_files_cut_by_the_planner_and_read_once(tmp_path, sync):
    records = warc_records(300)
    write_warc_file(records, str(tmp_path / "a.warc.gz"))
    raw = tmp_path / "b.warc"
    write_warc_file(records, str(raw))
    (tmp_path / "c.warc.gz").write_bytes(gzip.compress(raw.read_bytes()))  # gzipped whole: cannot be cut
    target = (tmp_path / "a.warc.gz").stat().st_size // 5
    ds = Dataset.from_files(str(tmp_path / "*.warc*")).load_warc(approx_shard_bytes=target)
    assert "2 cut into" in ds.describe() and "1 larger kept whole (WARC compressed whole)" in ds.describe()
    execution = sync.execute(ds)
    assert [r["url"] for r in execution] == [r["url"] for r in records] * 3
    stored = sum(p.stat().st_size for p in tmp_path.glob("*.warc*"))
    # a span reads on past its end by at most fastwarc's 64 KiB buffer, and scans 16 KiB at its
    # start and at its end for the next record: bytes a large span does not notice
    spans = len(ds.plan().stages[0].input) - 1
    assert stored <= execution.counters["zephyr/bytes_read"] < stored + spans * 112 * 1024


def test_a_whole_warc_file_counts_its_bytes_read_once(tmp_path, sync):
    """Regression: the payloads were counted under zephyr/bytes_read again, on top of the file's bytes."""
    records = warc_records(300)
    write_warc_file(records, str(tmp_path / "a.warc"))
    write_warc_file(records, str(tmp_path / "b.warc.gz"))
    stored = sum(p.stat().st_size for p in tmp_path.glob("*.warc*"))
    whole = sync.execute(Dataset.from_files(str(tmp_path / "*.warc*")).load_warc())
    assert len(list(whole)) == 2 * len(records)
    assert stored <= whole.counters["zephyr/bytes_read"] < 1.01 * stored + 2 * 4096  # the last record is read twice


def test_a_warc_span_that_cannot_be_told_apart_fails_instead_of_losing_records(tmp_path):
    records = warc_records(20, fake_header_in=10)
    path = tmp_path / "a.warc"
    write_warc_file(records, str(path))
    data = path.read_bytes()
    fake = data.index(b"WARC/1.1\r\nWARC-Type: response\r\nContent-Length: 5")
    cut = fake - 100  # inside record 10, before the WARC header its page shows
    with pytest.raises(UncuttableWarcError, match=rf"cannot read bytes 0-{cut} on their own"):
        list(read_warc(str(path), span=(0, cut)))
    whole = tmp_path / "whole.warc.gz"
    whole.write_bytes(gzip.compress(data))
    with pytest.raises(UncuttableWarcError):
        list(read_warc(str(whole), span=(0, whole.stat().st_size // 2)))
    assert [r["url"] for r in read_warc(str(path))] == [r["url"] for r in records]  # read whole: all of it


def test_a_page_holding_a_gzipped_warc_record_does_not_mislead_the_scan(tmp_path):
    """The scan for the next record takes the earliest start of either kind (a plain header, a
    gzip member): it took any gzip member first, here one inside a later page, so the span
    after the cut started there and the cut could not be made."""
    records = warc_records(12)
    inner = tmp_path / "inner.warc.gz"
    write_warc_file(warc_records(1), str(inner))
    records[6]["content"] = b"see this archive: " + inner.read_bytes()
    path = tmp_path / "a.warc"
    write_warc_file(records, str(path))
    data = path.read_bytes()
    cut = data.index(b"WARC-Target-URI: http://example.com/5") - 300  # before record 5, in the scan's reach of record 6
    got = [r["url"] for span in ((0, cut), (cut, len(data))) for r in read_warc(str(path), span=span)]
    assert got == [r["url"] for r in records]


# ---- skip_existing and resume stay exact --------------------------------------------------------


def outputs(out: Path) -> dict[str, list[int]]:
    return {p.name: ids(json.loads(line) for line in p.read_text().splitlines())
            for p in sorted(out.iterdir()) if not p.name.startswith(".") and p.name != RECORD_NAME}


def test_skip_existing_redoes_exactly_the_shards_whose_input_changed(tmp_path, sync):
    inputs, out, fresh = tmp_path / "in", tmp_path / "out", tmp_path / "fresh"
    inputs.mkdir()
    write_lines(inputs / "a.jsonl", ragged(120, seed=9))
    for k in range(8):
        write_lines(inputs / f"s{k}.jsonl", [{"i": 1000 + k, "t": "y" * 200}])
    target = (inputs / "a.jsonl").stat().st_size // 3 + 100  # still three spans once a short line is appended

    def run(into: Path):
        ds = Dataset.from_files(str(inputs / "*.jsonl")).load_jsonl(approx_shard_bytes=target)
        execution = sync.execute(ds.write_jsonl(str(into / "part-{shard:03d}.jsonl"), skip_existing=True))
        list(execution)
        return execution.counters.get("zephyr/shards_skipped_existing", 0), len(ds.plan().stages[0].input)

    skipped, shards = run(out)
    assert skipped == 0 and len(list(out.glob(f".*{SIDECAR_SUFFIX}"))) == shards
    assert run(out) == (shards, shards)  # nothing changed: every shard kept
    write_lines(inputs / "s5.jsonl", [{"i": 2005, "t": "z" * 200}])  # one packed file rewritten
    skipped, _ = run(out)
    assert skipped == shards - 1
    run(fresh)
    assert outputs(out) == outputs(fresh)  # the oracle: a clean run over the inputs now
    with open(inputs / "a.jsonl", "a") as f:  # the large file grows: every span of it moves
        f.write(json.dumps({"i": 999, "t": ""}) + "\n")
    skipped, _ = run(out)
    assert skipped == shards - 3
    run(fresh := tmp_path / "fresh2")
    assert outputs(out) == outputs(fresh) and 999 in sum(outputs(out).values(), [])


def test_the_plan_identity_names_every_packed_file(tmp_path):
    for name in ("a", "b", "c"):
        write_lines(tmp_path / f"{name}.jsonl", [{"i": 1}])

    def plan():
        return Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl(approx_shard_bytes=1 << 20).plan()

    before = plan()
    os.rename(tmp_path / "b.jsonl", tmp_path / "bb.jsonl")  # same bytes, inode and mtime; the label names a .. c only
    after = plan()
    assert before.stages[0].input[0].label == after.stages[0].input[0].label
    assert before.fingerprint != after.fingerprint


# ---- object storage: large sequential reads -------------------------------------------------------


@pytest.fixture
def counted_gcs(gcs_emulator, faulty_gcs, monkeypatch):
    """gcsfs in this process talks to the emulator through a proxy that logs every request."""
    proxy = faulty_gcs()
    monkeypatch.setenv("STORAGE_EMULATOR_HOST", proxy.url)
    gcsfs.GCSFileSystem.clear_instance_cache()
    yield proxy
    gcsfs.GCSFileSystem.clear_instance_cache()


def big_object(bucket: str) -> str:
    big = "".join(json.dumps({"i": i, "t": "w" * 200}) + "\n" for i in range(60_000))  # ~13 MB, 60,000 records
    fsspec.filesystem("gs").pipe(f"{bucket}/in/big.jsonl", big.encode())
    return big


def test_a_whole_file_is_read_from_object_storage_in_large_blocks(gcs_bucket, counted_gcs, sync):
    """Regression: gcsfs's default cache sent a request per ~150 KB read (88 for 13 MB)."""
    big = big_object(gcs_bucket)
    for loader in ("load_jsonl", "load_file"):
        start = len(counted_gcs.log)
        assert len(list(sync.execute(getattr(Dataset.from_files(f"{gcs_bucket}/in/big.jsonl"), loader)()))) == 60_000
        data = [r for r in counted_gcs.log[start:] if r.startswith("GET") and "alt=media" in r]
        assert len(data) <= -(-len(big) // (5 << 20)) + 1  # gcsfs's 5 MiB blocks, each one request


def test_spans_and_packed_files_read_object_storage_in_few_large_requests(gcs_bucket, counted_gcs, sync):
    fs = fsspec.filesystem("gs")
    big = big_object(gcs_bucket)
    for k in range(40):
        fs.pipe(f"{gcs_bucket}/in/s{k:02d}.jsonl", "".join(json.dumps({"i": 100_000 + 50 * k + j}) + "\n" for j in range(50)).encode())
    fs.invalidate_cache()
    target = len(big) // 3 + 1
    ds = Dataset.from_files(f"{gcs_bucket}/in/*.jsonl").load_jsonl(approx_shard_bytes=target)
    shards = ds.plan().stages[0].input
    assert [isinstance(s.items[0], ByteRange) for s in shards] == [True] * 3 + [False] * 10  # 4 small files a shard:
    assert FILE_COST["object store"] == 1 << 20  # each costs 1 MiB on an object store
    start = len(counted_gcs.log)
    got = ids(sync.execute(ds))
    assert got == list(range(60_000)) + [100_000 + n for n in range(2000)]
    reads = [r for r in counted_gcs.log[start:] if r.startswith("GET")]
    big_reads = [r for r in reads if "big.jsonl" in r]
    # each span: gcsfs's metadata requests when opening (3), then blocks of its 5 MiB (a span is
    # 4.4 MB: one or two). gcsfs's default cache made a request per ~150 KB: 82 for one span.
    assert sum("alt=media" in r for r in big_reads) <= 3 * 2 and len(big_reads) <= 3 * (3 + 2)
    small_reads = [r for r in reads if "big.jsonl" not in r]
    assert len(small_reads) <= 40 * (3 + 1)  # metadata and one read per small file, not one per record
