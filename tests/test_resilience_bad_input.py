"""Bad input through a writing pipeline: a clear error naming file, line/record and shard, and
only complete outputs left behind."""

import gzip
import os
from pathlib import Path

import orjson
import pytest
import zstandard

from zephyr import Dataset, ShardError, create_backend
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output

pytestmark = pytest.mark.resilience

GOOD = [{"id": i, "text": f"doc {i}"} for i in range(100)]


def write_good(directory: Path) -> None:
    for name in ("a", "c"):
        (directory / f"{name}.jsonl").write_bytes(b"".join(orjson.dumps(r) + b"\n" for r in GOOD))


def truncated(directory, ext, compress):
    data = compress(b"".join(orjson.dumps({"id": i, "text": "x" * 40}) + b"\n" for i in range(20000)))
    (directory / f"b.{ext}").write_bytes(data[: len(data) // 2])


SCENARIOS = {
    "truncated-zst": (lambda d: truncated(d, "jsonl.zst", zstandard.ZstdCompressor().compress), "TruncatedInputError", "b.jsonl.zst: zstd stream ended in the middle of a frame"),
    "truncated-gz": (lambda d: truncated(d, "jsonl.gz", gzip.compress), "TruncatedInputError", "b.jsonl.gz: gzip stream ended early"),
    "malformed-json": (lambda d: (d / "b.jsonl").write_bytes(b'{"id": 1}\n{"id": 2,\n'), "BadRecordError", "b.jsonl:2: malformed JSON"),
    "non-utf8": (lambda d: (d / "b.jsonl").write_bytes(b'{"id": 1}\n{"t": "\xe9t\xe9"}\n'), "BadRecordError", "b.jsonl:2: malformed JSON"),
    "empty-compressed": (lambda d: (d / "b.jsonl.zst").write_bytes(b""), "TruncatedInputError", "b.jsonl.zst: the file is empty (0 bytes)"),
    "huge-malformed-line": (lambda d: (d / "b.jsonl").write_bytes(b'{"id": 0}\n{"text": "' + b"y" * 50_000_000 + b"\n"), "BadRecordError", "b.jsonl:2: malformed JSON"),
}


def pipeline(directory: Path, out: Path):
    return Dataset.from_files(str(directory / "*.jsonl*")).load_jsonl().map(lambda r: {**r, "n": len(r.get("text", ""))}).write_jsonl(str(out / "part-{shard}.jsonl.zst"))


def assert_only_complete_outputs(out: Path, expected_complete: dict) -> None:
    for path in out.iterdir() if out.exists() else ():
        if path.name == RECORD_NAME:  # the failed run's record: not an output
            continue
        assert not path.name.startswith("."), f"temporary left behind: {path.name}"
        assert path.name in expected_complete, f"unexpected output {path.name}"
        assert path.read_bytes() == expected_complete[path.name]


@pytest.mark.parametrize("scenario", sorted(SCENARIOS))
def test_bad_input_is_reported_with_file_and_shard_and_leaves_no_partial_output(tmp_path, scenario):
    make_bad, error_type, message = SCENARIOS[scenario]
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    write_good(inputs)
    make_bad(inputs)
    backend = create_backend("threadpool", max_parallelism=3, progress=False)
    with pytest.raises(ShardError) as info:
        list(backend.execute(pipeline(inputs, out)))
    err = info.value
    assert err.error_type == error_type
    assert err.shard == 1 and Path(err.source).name.startswith("b.")  # files sort a, b, c
    assert message in str(err)
    assert len(str(err)) < 10_000  # a 50 MB line is not pasted into the message
    # shards a (0) and c (2) may have finished; whatever exists is complete; shard 1 wrote nothing
    assert_only_complete_outputs(out, _expected_good_outputs(tmp_path))


def _expected_good_outputs(tmp_path):
    """What a clean run writes for shards 0 (a.jsonl) and 2 (c.jsonl), numbered as in the faulty run."""
    ref_out = tmp_path / "ref-out"
    only_good = tmp_path / "only-good"
    only_good.mkdir()
    write_good(only_good)
    backend = create_backend("sync", progress=False)
    ds = Dataset.from_list([str(only_good / "a.jsonl"), "SKIP", str(only_good / "c.jsonl")]).filter(lambda p: p != "SKIP")
    ds = ds.load_jsonl().map(lambda r: {**r, "n": len(r.get("text", ""))}).write_jsonl(str(ref_out / "part-{shard}.jsonl.zst"))
    list(backend.execute(ds))
    return {p.name: p.read_bytes() for p in ref_out.iterdir() if p.name not in ("part-1.jsonl.zst", RECORD_NAME)}


def test_a_50_mb_single_line_is_a_record_like_any_other(tmp_path):
    big = {"id": 1, "text": "z" * 50_000_000}
    path = tmp_path / "big.jsonl.zst"
    path.write_bytes(zstandard.ZstdCompressor().compress(orjson.dumps(big) + b"\n" + orjson.dumps({"id": 2, "text": "small"}) + b"\n"))
    backend = create_backend("sync", progress=False)
    got = list(backend.execute(Dataset.from_files(str(path)).load_jsonl().map(lambda r: (r["id"], len(r["text"])))))
    assert got == [(1, 50_000_000), (2, 5)]


def test_a_file_missing_between_planning_and_running(tmp_path):
    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    write_good(inputs)
    (inputs / "b.jsonl").write_bytes(b'{"id": 1}\n')
    backend = create_backend("sync", progress=False)
    execution = backend.execute(pipeline(inputs, out))  # planned: three files
    os.remove(inputs / "b.jsonl")
    with pytest.raises(ShardError) as info:
        list(execution)
    assert info.value.shard == 1
    assert f"Input file not found: {inputs / 'b.jsonl'}" in str(info.value)
    assert sorted(p.name for p in out.iterdir() if p.name != RECORD_NAME) == ["part-0.jsonl.zst"]  # the sync run stopped at shard 1


def test_a_non_picklable_function_runs_in_process_with_a_warning(tmp_path):
    """In-process backends run what they are given; only Ray needs functions to pickle
    (its refusal before any task starts is tested in lib/zephyr/tests/test_errors.py)."""
    import threading

    from zephyr import NotPicklableWarning

    inputs, out = tmp_path / "in", tmp_path / "out"
    inputs.mkdir()
    write_good(inputs)
    lock = threading.Lock()

    def locked(r):
        with lock:
            return r

    ds = Dataset.from_files(str(inputs / "*.jsonl")).load_jsonl().map(locked).write_jsonl(str(out / "p-{shard}.jsonl"))
    with pytest.warns(NotPicklableWarning, match=r"map\(.*locked\) .*cannot be pickled.*will not run on the ray backend"):
        paths = list(create_backend("threadpool", progress=False).execute(ds))
    assert len(paths) == len(list(inputs.iterdir())) and all(os.path.exists(p) for p in paths)


def test_dirty_corpus_policy_skips_and_counts_bad_records(tmp_path):
    inputs = tmp_path / "in"
    inputs.mkdir()
    (inputs / "dirty.jsonl").write_bytes(b'{"id": 1}\nnot json\n{"id": 3}\n\xff\n{"id": 5}\n')
    backend = create_backend("sync", progress=False)
    execution = backend.execute(Dataset.from_files(str(inputs / "*.jsonl")).load_jsonl(on_bad_record="skip"))
    assert [r["id"] for r in execution] == [1, 3, 5]
    assert execution.counters["zephyr/bad_records"] == 2
    from zephyr.execution.summary import format_summary

    assert "zephyr/bad_records" in format_summary(execution)  # never silently: it is in the summary
