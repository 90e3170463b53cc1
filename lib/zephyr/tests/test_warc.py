"""WARC/WET files as a source: records read as written, one shard per file, bad records named
by file and byte offset (or skipped and counted), never a silent loss.

The oracle is plain Python written from the WARC 1.1 spec (header lines, CRLF, Content-Length,
one gzip member per record), not fastwarc, which the reader and writer use.
"""

from __future__ import annotations

import gzip
import pickle
import re
import zlib

import pytest

from zephyr import Dataset, ShardError
from zephyr.errors import InputNotFoundError
from zephyr.io import BadRecordError, BadWarcRecordError, read_warc, write_warc_file
from zephyr.readers import load_file

PAGES = [
    ("https://example.org/a", "text/html", "utf-8", 200, "<html><body><h1>Á</h1><p>first page</p></body></html>".encode()),
    ("https://example.org/b", "text/html", "iso-8859-1", 200, "<p>caf\xe9</p>".encode("latin-1")),
    ("https://example.org/c", "application/pdf", None, 200, bytes(range(256)) * 40),  # binary payload
    ("https://example.org/d", "text/html", "utf-8", 404, b""),
]


def _response(url: str, content_type: str, charset: str | None, status: int, body: bytes, number: int) -> bytes:
    """One WARC/1.1 response record, as the spec lays it out."""
    ctype = content_type + (f"; charset={charset}" if charset else "")
    http = f"HTTP/1.1 {status} X\r\nContent-Type: {ctype}\r\nContent-Length: {len(body)}\r\n\r\n".encode() + body
    head = (f"WARC/1.1\r\nWARC-Type: response\r\nWARC-Target-URI: {url}\r\nWARC-Date: 2026-01-0{number + 1}T00:00:00Z\r\n"
            f"WARC-Record-ID: <urn:uuid:00000000-0000-0000-0000-00000000000{number}>\r\n"
            f"Content-Type: application/http; msgtype=response\r\nContent-Length: {len(http)}\r\n\r\n").encode()
    return head + http + b"\r\n\r\n"


def _request(url: str) -> bytes:
    http = f"GET / HTTP/1.1\r\nHost: {url}\r\n\r\n".encode()
    return (f"WARC/1.1\r\nWARC-Type: request\r\nWARC-Target-URI: {url}\r\nContent-Length: {len(http)}\r\n\r\n").encode() + http + b"\r\n\r\n"


def _crawl(tmp_path, name: str = "crawl.warc.gz", pieces: list[bytes] | None = None) -> tuple[str, list[int]]:
    """A file of the PAGES (each after a request record), gzipped per record when named .gz;
    returns its path and the byte offset of each response."""
    if pieces is None:
        pieces = []
        for i, page in enumerate(PAGES):
            pieces += [_request(page[0]), _response(*page, i)]
    packed = [gzip.compress(p, mtime=0) if name.endswith(".gz") else p for p in pieces]
    offsets, at = [], 0
    for raw, piece in zip(pieces, packed):
        if b"WARC-Type: response" in raw:
            offsets.append(at)
        at += len(piece)
    path = tmp_path / name
    path.write_bytes(b"".join(packed))
    return str(path), offsets


@pytest.mark.parametrize("name", ["crawl.warc.gz", "crawl.warc"])
def test_every_response_is_read_with_its_fields_and_exact_payload(tmp_path, name):
    path, offsets = _crawl(tmp_path, name)
    records = list(read_warc(path))
    assert [(r["url"], r["content_type"], r["charset"], r["status"], r["content"]) for r in records] == [
        (url, ctype, charset, status, body) for url, ctype, charset, status, body in PAGES]
    assert [r["offset"] for r in records] == offsets
    assert [r["date"] for r in records] == [f"2026-01-0{i + 1}T00:00:00Z" for i in range(len(PAGES))]
    assert records[0]["record_id"] == "<urn:uuid:00000000-0000-0000-0000-000000000000>"


def test_wet_conversion_records_are_read_as_text_records(tmp_path):
    text = "Ein Absatz.\nA paragraph.".encode()
    record = (f"WARC/1.0\r\nWARC-Type: conversion\r\nWARC-Target-URI: https://example.org/t\r\nWARC-Date: 2026-02-01T00:00:00Z\r\n"
              f"Content-Type: text/plain\r\nContent-Length: {len(text)}\r\n\r\n").encode() + text + b"\r\n\r\n"
    path, _ = _crawl(tmp_path, "crawl.wet.gz", [record])
    [got] = read_warc(path)
    assert (got["url"], got["content_type"], got["charset"], got["status"], got["content"]) == (
        "https://example.org/t", "text/plain", "utf-8", None, text)


def test_written_records_follow_the_spec_and_read_back(tmp_path):
    path = str(tmp_path / "out.warc.gz")
    records = [{"url": url, "content_type": ctype, "charset": charset, "status": status, "content": body,
                "date": "2026-03-01T00:00:00Z"} for url, ctype, charset, status, body in PAGES]
    assert write_warc_file(records, path) == len(PAGES)
    data = open(path, "rb").read()
    members = []
    while data:  # one gzip member per record, each a WARC header block, a block of Content-Length bytes, CRLF CRLF
        inflate = zlib.decompressobj(31)
        members.append(inflate.decompress(data))
        data = inflate.unused_data
    assert len(members) == len(PAGES)
    for member, (url, _, _, _, body) in zip(members, PAGES):
        head, _, rest = member.partition(b"\r\n\r\n")
        fields = dict(line.split(": ", 1) for line in head.decode().split("\r\n")[1:])
        assert head.startswith(b"WARC/1.1\r\n") and fields["WARC-Type"] == "response" and fields["WARC-Target-URI"] == url
        assert len(rest) == int(fields["Content-Length"]) + 4 and rest.endswith(b"\r\n\r\n")
        assert rest[:-4].endswith(body) and "WARC-Block-Digest" in fields
    assert [r["content"] for r in read_warc(path)] == [p[4] for p in PAGES]
    again = str(tmp_path / "again.warc.gz")
    write_warc_file(records, again)
    assert open(again, "rb").read() == open(path, "rb").read()  # same records, same bytes


def test_a_dataset_reads_one_shard_per_file_and_by_extension(tmp_path, backend):
    for i in range(3):
        (tmp_path / f"part{i}").mkdir()
        _crawl(tmp_path / f"part{i}")
    pattern = str(tmp_path / "part*" / "crawl.warc.gz")
    execution = backend.execute(Dataset.from_files(pattern).load_warc(include_file_paths=True).map(lambda r: (r["__file_path"], r["url"])))
    got = sorted(execution)
    assert got == sorted((str(tmp_path / f"part{i}" / "crawl.warc.gz"), p[0]) for i in range(3) for p in PAGES)
    assert len(execution.shard_results) == 3 if hasattr(execution, "shard_results") else True
    by_extension = backend.execute(Dataset.from_files(pattern).load_file().map(lambda r: r["url"]))
    assert sorted(by_extension) == sorted(p[0] for _ in range(3) for p in PAGES)
    assert [r["url"] for r in load_file(str(tmp_path / "part0" / "crawl.warc.gz"))] == [p[0] for p in PAGES]


def _damaged(tmp_path, kind: str) -> tuple[str, int, list[str]]:
    """A crawl with one fault; returns its path, the byte offset the fault starts at and the
    URLs a skipping reader still gets."""
    pieces = []
    for i, page in enumerate(PAGES):
        pieces += [_request(page[0]), _response(*page, i)]
    members = [gzip.compress(p, mtime=0) for p in pieces]
    at = sum(map(len, members[:4]))  # where the third page's request starts
    urls = [p[0] for p in PAGES]
    if kind == "corrupt member":  # the third page's response has its deflate stream damaged
        member = bytearray(members[5])
        member[30:60] = bytes(b ^ 0x5A for b in member[30:60])
        members[5] = bytes(member)
        at, urls = sum(map(len, members[:5])), urls[:2] + urls[3:]
    elif kind == "garbage between":
        members.insert(4, b"this is no gzip member" * 5)
    elif kind == "not a WARC record":
        members.insert(4, gzip.compress(b"NOT A WARC\r\nX: y\r\n\r\nhello", mtime=0))
    elif kind == "truncated tail":
        members[-1] = members[-1][:40]
        at, urls = sum(map(len, members[:-1])), urls[:-1]
    path = tmp_path / "damaged.warc.gz"
    path.write_bytes(b"".join(members))
    return str(path), at, urls


@pytest.mark.parametrize("kind", ["corrupt member", "garbage between", "not a WARC record", "truncated tail"])
def test_a_bad_record_names_file_and_offset_or_is_skipped_and_counted(tmp_path, local_backend, kind):
    path, offset, urls = _damaged(tmp_path, kind)
    with pytest.raises(BadWarcRecordError, match=rf"damaged\.warc\.gz: bad WARC record at byte {offset}\b") as info:
        list(read_warc(path))
    assert info.value.offset == offset and info.value.path == path and isinstance(info.value, BadRecordError)
    with pytest.raises(ShardError, match=rf"bad WARC record at byte {offset}"):
        list(local_backend.execute(Dataset.from_list([path]).load_warc()))
    execution = local_backend.execute(Dataset.from_list([path]).load_warc(on_bad_record="skip").map(lambda r: r["url"]))
    assert list(execution) == urls  # every good record, the one after the fault included
    assert execution.counters["zephyr/bad_records"] == 1


def test_a_payload_cut_short_in_a_plain_file_is_a_bad_record(tmp_path):
    pieces = [_response(*page, i) for i, page in enumerate(PAGES[:2])]
    path, offsets = _crawl(tmp_path, "cut.warc", pieces)
    data = open(path, "rb").read()
    cut = tmp_path / "cut.warc"
    cut.write_bytes(data[: offsets[1] + len(pieces[1]) - 20])
    with pytest.raises(BadWarcRecordError, match=rf"at byte {offsets[1]}\b"):
        list(read_warc(str(cut)))
    assert [r["url"] for r in read_warc(str(cut), on_bad_record="skip")] == [PAGES[0][0]]


def test_missing_file_and_bad_policy(tmp_path):
    with pytest.raises(InputNotFoundError, match="nothing.warc.gz"):
        list(read_warc(str(tmp_path / "nothing.warc.gz")))
    with pytest.raises(ValueError, match="on_bad_record must be 'raise' or 'skip', got 'ignore'"):
        Dataset.from_list(["x.warc"]).load_warc(on_bad_record="ignore")


def test_the_error_survives_pickling_for_ray():
    error = pickle.loads(pickle.dumps(BadWarcRecordError("gs://b/x.warc.gz", 1234, "Invalid WARC header")))
    assert (error.path, error.offset, error.reason) == ("gs://b/x.warc.gz", 1234, "Invalid WARC header")
    assert re.search(r"x\.warc\.gz: bad WARC record at byte 1234: Invalid WARC header", str(error))
