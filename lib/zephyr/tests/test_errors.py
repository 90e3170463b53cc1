"""Bad input gets a clear error: file and line, shard and source, and the original traceback."""

import gzip

import pytest

from zephyr import BadRecordError, Dataset, PlanError, ShardError, TruncatedInputError


def test_malformed_json_line_names_file_and_line(backend, tmp_path):
    good = tmp_path / "a.jsonl"
    good.write_text('{"ok": 1}\n')
    bad = tmp_path / "b.jsonl"
    bad.write_text('{"ok": 1}\n{"ok": 2}\n{"ok": \n{"ok": 4}\n')
    with pytest.raises(ShardError) as info:
        list(backend.execute(Dataset.from_files(str(tmp_path / "*.jsonl")).load_jsonl()))
    err = info.value
    assert err.shard == 1
    assert err.source == str(bad)
    assert err.error_type == "BadRecordError"
    assert f"{bad}:3: malformed JSON" in str(err)


def test_user_exception_names_shard_source_and_original_traceback(backend):
    def parse(x):
        if x == "bad-item":
            raise KeyError("missing field 'text'")
        return x

    with pytest.raises(ShardError) as info:
        list(backend.execute(Dataset.from_list(["ok", "bad-item", "ok2"]).map(parse)))
    message = str(info.value)
    assert "stage 0, shard 1 (source: bad-item) failed with KeyError" in message
    assert "missing field 'text'" in message
    assert "in parse" in message and "raise KeyError" in message  # the original traceback


@pytest.mark.parametrize("judge", ["is_transient_storage_error", "failed_record"])
def test_a_failure_that_cannot_be_judged_still_reaches_the_driver_as_itself(local_backend, monkeypatch, judge):
    """Regression: an error raised while judging a shard's failure (is it a transient storage
    error, which record did it hit) replaced the user's error: CI once saw a MemoryError reach the
    driver as an AttributeError, and be retried as the user's fault instead of with more memory."""
    import zephyr.execution.shard as shard

    calls = []

    def broken(*args, **kwargs):
        calls.append(judge)
        raise AttributeError("partially initialized module 'gcsfs' has no attribute 'retry'")

    monkeypatch.setattr(shard, judge, broken)

    def parse(x):
        if x == "bad-item":
            raise MemoryError("cannot allocate the working set")
        return x

    with pytest.raises(ShardError) as info:
        list(local_backend.execute(Dataset.from_list(["ok", "bad-item"]).map(parse)))
    assert calls and set(calls) == {judge}  # the fault landed (in every attempt: each got more memory)
    assert info.value.error_type == "MemoryError" and "cannot allocate the working set" in str(info.value)
    assert "zephyr could not judge this failure: AttributeError: partially initialized" in info.value.traceback_text


def test_bad_records_can_be_skipped_and_are_counted(backend, tmp_path):
    path = tmp_path / "dirty.jsonl"
    path.write_bytes(b'{"a": 1}\n{"a": \n\xff\xfe{"a": 3}\n{"a": 4}\n')
    execution = backend.execute(Dataset.from_list([str(path)]).load_jsonl(on_bad_record="skip"))
    assert list(execution) == [{"a": 1}, {"a": 4}]
    assert execution.counters["zephyr/bad_records"] == 2


def test_non_utf8_line_is_a_bad_record(local_backend, tmp_path):
    path = tmp_path / "latin1.jsonl"
    path.write_bytes('{"a": "ok"}\n{"a": "caf\u00e9"}\n'.encode("latin-1"))
    with pytest.raises(ShardError, match=r"latin1.jsonl:2: malformed JSON"):
        list(local_backend.execute(Dataset.from_list([str(path)]).load_jsonl()))


@pytest.mark.parametrize("ext", ["jsonl.gz", "jsonl.zst", "jsonl.bz2", "jsonl.xz"])
def test_truncated_compressed_input_is_an_error_not_a_short_read(local_backend, tmp_path, ext):
    full = tmp_path / f"full.{ext}"
    list(local_backend.execute(Dataset.from_iterable({"i": i, "pad": "x" * 50} for i in range(20000)).write_jsonl(str(full))))
    cut = tmp_path / f"cut.{ext}"
    data = full.read_bytes()
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(ShardError) as info:
        list(local_backend.execute(Dataset.from_list([str(cut)]).load_jsonl()))
    assert info.value.error_type == "TruncatedInputError"
    assert str(cut) in str(info.value)


def test_missing_input_file_at_run_time(backend, tmp_path):
    with pytest.raises(ShardError, match=r"Input file not found: .*nope\.jsonl"):
        list(backend.execute(Dataset.from_list([str(tmp_path / "nope.jsonl")]).load_jsonl()))


def test_from_files_missing_path_or_empty_glob(tmp_path, local_backend):
    with pytest.raises(FileNotFoundError, match=r"nothing-here/\*\.jsonl' matched no files"):
        local_backend.execute(Dataset.from_files(str(tmp_path / "nothing-here" / "*.jsonl")).load_jsonl())
    with pytest.raises(FileNotFoundError, match=r"missing.jsonl' does not exist"):
        local_backend.execute(Dataset.from_files(str(tmp_path / "missing.jsonl")))
    empty = Dataset.from_files(str(tmp_path / "*.jsonl"), empty_glob_ok=True).load_jsonl()
    assert list(local_backend.execute(empty)) == []


def test_an_input_the_store_cannot_look_at_is_not_called_missing(tmp_path, local_backend):
    """Regression: any error looking at a literal input (a store's 503 past its own retries,
    here a name too long for the filesystem) was reported as "does not exist", a
    FileNotFoundError the runner never retries. Only absence now reads as absent."""
    too_long = str(tmp_path / ("x" * 300 + ".jsonl"))
    with pytest.raises(OSError, match="File name too long") as raised:
        local_backend.execute(Dataset.from_files(too_long).load_jsonl())
    assert not isinstance(raised.value, FileNotFoundError)


def test_unknown_extension_is_a_clear_error_before_running(tmp_path, local_backend):
    (tmp_path / "data.csv").write_text("a,b\n")
    known = r"known: .jsonl, .ndjson, .json, .parquet, .vortex, .warc, .wet, each optionally compressed \(.gz, .gzip, .zst, .zstd, .bz2, .xz\)"
    with pytest.raises(ValueError, match=r"Cannot tell the format of .*data.csv.*Unsupported extension.*" + known):
        local_backend.execute(Dataset.from_files(str(tmp_path / "*.csv")).load_file())


@pytest.mark.ray
def test_unpicklable_function_is_reported_before_any_task_starts(ray_shared, tmp_path):
    import threading

    from zephyr import create_backend

    lock = threading.Lock()
    calls = tmp_path / "calls"

    def uses_lock(x):
        calls.write_text("ran")
        with lock:
            return x

    backend = create_backend("ray", progress=False)
    try:
        with pytest.raises(PlanError, match=r"stage 0: map\(.*uses_lock.*cannot be pickled"):
            backend.execute(Dataset.from_list([1, 2]).map(uses_lock))
    finally:
        backend.close()
    assert not calls.exists()


def test_error_types_are_importable_and_picklable():
    import pickle

    e = BadRecordError("f.jsonl", 3, "bad")
    assert pickle.loads(pickle.dumps(e)).line == 3
    t = ShardError(0, 1, "src", "KeyError", "k", "tb")
    assert str(pickle.loads(pickle.dumps(t))) == str(t)
    assert issubclass(TruncatedInputError, EOFError)


@pytest.mark.ray
def test_function_the_workers_cannot_import_fails_fast_instead_of_being_retried_as_lost(ray_shared, tmp_path):
    """Regression: a worker-side unpickling error (RaySystemError) was retried 100 times as a lost task."""
    import importlib.util
    import sys

    from zephyr import create_backend

    module_path = tmp_path / "only_on_the_driver.py"
    module_path.write_text("def bump(x):\n    return x + 1\n")
    spec = importlib.util.spec_from_file_location("only_on_the_driver", module_path)
    module = sys.modules["only_on_the_driver"] = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    backend = create_backend("ray", progress=False)
    try:
        execution = backend.execute(Dataset.from_list([1, 2]).map(module.bump))
        with pytest.raises(ShardError, match="No module named 'only_on_the_driver'"):
            list(execution)
        assert sum(s.retries_lost for s in execution.stats) == 0
    finally:
        del sys.modules["only_on_the_driver"]


@pytest.mark.parametrize("ext, header", [("jsonl.zst", b"\x28\xb5\x2f\xfd"), ("jsonl.gz", b"\x1f\x8b"),
                                         ("jsonl.bz2", b"BZh9"), ("jsonl.xz", b"\xfd7zXZ\x00")])
def test_corrupt_compressed_input_names_the_file(local_backend, tmp_path, ext, header):
    """Regression: a corrupt (not truncated) .zst raised a bare ZstdError naming no file."""
    path = tmp_path / f"bad.{ext}"
    path.write_bytes(header + b"\x00garbage that is not a valid stream" * 10)
    with pytest.raises(ShardError) as info:
        list(local_backend.execute(Dataset.from_list([str(path)]).load_jsonl()))
    assert info.value.error_type == "CorruptInputError"
    assert f"{path}: not a valid" in str(info.value)


def test_unpicklable_reducer_is_named(local_backend):
    import threading

    lock = threading.Lock()

    def locked_sum(key, items):
        with lock:
            return sum(items)

    with pytest.warns(UserWarning, match=r"locked_sum.*will not run on the ray backend"):
        got = sorted(local_backend.execute(Dataset.from_list([1, 2, 3]).group_by(lambda x: x % 2, locked_sum)))
    assert got == [2, 4]


@pytest.mark.parametrize("ext, compress", [("jsonl.bz2", "bz2"), ("jsonl.xz", "lzma")])
def test_bzip2_and_xz_inputs_are_read_not_skipped_as_bad_records(local_backend, tmp_path, ext, compress):
    """Regression: a .bz2 file was read as plain bytes, so its first line was "malformed JSON"
    and with on_bad_record="skip" the whole file vanished, counted as one bad record. The oracle
    is the standard library's own decompressor."""
    import importlib
    import json

    records = [{"i": i, "text": f"doc {i}"} for i in range(1000)]
    path = tmp_path / f"in.{ext}"
    path.write_bytes(importlib.import_module(compress).compress("".join(json.dumps(r) + "\n" for r in records).encode()))
    execution = local_backend.execute(Dataset.from_list([str(path)]).load_jsonl(on_bad_record="skip"))
    assert list(execution) == records
    assert execution.counters.get("zephyr/bad_records", 0) == 0
    out = tmp_path / f"out.{ext}"
    list(local_backend.execute(Dataset.from_list([records]).flat_map(list).write_jsonl(str(out))))
    lines = importlib.import_module(compress).decompress(out.read_bytes()).decode().splitlines()
    assert [json.loads(line) for line in lines] == records
