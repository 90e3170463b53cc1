"""skip_existing, atomic outputs, and output patterns."""

import os

import pytest

from zephyr import Dataset, PlanError, ShardError, counters
from zephyr.io import atomic_write
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output


def counted(x):
    counters.increment("calls")
    return {"x": x}


def test_skip_existing_skips_all_upstream_work_and_still_yields_the_path(backend, tmp_path):
    pattern = str(tmp_path / "out-{shard:02d}.jsonl")
    ds = Dataset.from_list([0, 1, 2]).flat_map(lambda i: range(i * 10, i * 10 + 5)).map(counted).write_jsonl(pattern, skip_existing=True)
    first = backend.execute(ds)
    paths = list(first)
    assert first.counters["calls"] == 15
    os.remove(paths[1])
    before = {p: open(p, "rb").read() for p in (paths[0], paths[2])}
    second = backend.execute(ds)
    assert list(second) == paths
    assert second.counters["calls"] == 5  # only shard 1 ran
    assert second.counters["zephyr/shards_skipped_existing"] == 2
    assert {p: open(p, "rb").read() for p in (paths[0], paths[2])} == before


def test_without_skip_existing_everything_reruns(backend, tmp_path):
    ds = Dataset.from_list([0, 1]).map(counted).write_jsonl(str(tmp_path / "o-{shard}.jsonl"))
    list(backend.execute(ds))
    again = backend.execute(ds)
    list(again)
    assert again.counters["calls"] == 2


def test_failure_mid_shard_leaves_no_file_and_litter_is_cleaned_next_time(local_backend, tmp_path):
    def explode_at_3(x):
        if x == 3:
            raise RuntimeError("disk on fire")
        return {"x": x}

    target = tmp_path / "only.jsonl"
    ds = Dataset.from_iterable(range(6)).map(explode_at_3).write_jsonl(str(target))
    with pytest.raises(ShardError, match="disk on fire"):
        list(local_backend.execute(ds))
    assert not target.exists()
    assert [p.name for p in tmp_path.iterdir()] == [RECORD_NAME]  # the temporary is removed on failure

    # a killed writer (no chance to clean up) leaves a temporary behind ...
    (tmp_path / ".only.jsonl.zephyr-tmp-1234@0badc0de-deadbeef").write_bytes(b'{"x": 0}\n{"x"')
    list(local_backend.execute(Dataset.from_iterable(range(6)).map(lambda x: {"x": x}).write_jsonl(str(target))))
    # ... and the run that completes that output removes it
    assert sorted(p.name for p in tmp_path.iterdir()) == [RECORD_NAME, "only.jsonl"]
    assert target.read_text().count("\n") == 6


def test_a_killed_drivers_sidecar_and_record_temporaries_are_cleaned_by_the_next_run(local_backend, tmp_path):
    """Regression (CI): a driver killed while writing a skip_existing output's source record
    left `..NAME.zephyr-source.json.zephyr-tmp-*`; the rerun that made the output kept it. So
    did a run that ended and a driver killed while writing its run record."""
    import subprocess
    import sys

    from zephyr.io.temporaries import HOST_ID

    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)
    target = tmp_path / "only.jsonl"
    (tmp_path / "..only.jsonl.zephyr-source.json.zephyr-tmp-1234@0badc0de-deadbeef").write_bytes(b'{"writer"')
    (tmp_path / f".{RECORD_NAME}.zephyr-tmp-{dead}@{HOST_ID}-deadbeef").write_bytes(b'{"schema"')
    list(local_backend.execute(Dataset.from_iterable(range(3)).map(lambda x: {"x": x}).write_jsonl(str(target), skip_existing=True)))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted([RECORD_NAME, ".only.jsonl.zephyr-source.json", "only.jsonl"])


def test_atomic_write_spares_a_live_concurrent_writers_temporary(tmp_path):
    """Regression: after each write, every temporary of the same name was deleted, including
    those of concurrent writers still writing (ten executors recording one experiment)."""
    import subprocess
    import sys

    from zephyr.io.temporaries import HOST_ID as _HOST_ID

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    killed = tmp_path / f".x.json.zephyr-tmp-{int(dead.stdout)}@{_HOST_ID}-deadbeef"
    killed.write_bytes(b"{")
    live = tmp_path / f".x.json.zephyr-tmp-{os.getpid()}@{_HOST_ID}-0123abcd"
    live.write_bytes(b"in progress")
    with atomic_write(str(tmp_path / "x.json")) as f:
        f.write(b"{}")
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(["x.json", live.name])


def test_pattern_without_shard_for_many_shards_fails_before_any_work(backend, tmp_path):
    ds = Dataset.from_list([1, 2, 3]).map(counted).write_jsonl(str(tmp_path / "out.jsonl"))
    with pytest.raises(PlanError, match=r"must contain '\{shard\}' when writing 3 shards; got"):
        backend.execute(ds)
    assert list(tmp_path.iterdir()) == []


def test_single_shard_may_omit_the_shard_field(local_backend, tmp_path):
    [path] = list(local_backend.execute(Dataset.from_iterable([1, 2]).map(counted).write_jsonl(str(tmp_path / "all.jsonl"))))
    assert path == str(tmp_path / "all.jsonl")


def test_writer_output_can_feed_further_ops(local_backend, tmp_path):
    ds = Dataset.from_list([0, 1]).map(counted).write_jsonl(str(tmp_path / "o-{shard}.jsonl")).load_jsonl().map(lambda r: r["x"] + 100)
    assert list(local_backend.execute(ds)) == [100, 101]


def test_after_a_failure_no_other_shard_is_still_writing(tmp_path):
    """Regression: the run raised while another threadpool shard was mid-write, so a temporary
    (and later an output) appeared after the error had been returned."""
    import time

    from zephyr import create_backend

    def slow_or_bad(i):
        if i == 1:
            raise ValueError("bad shard")
        time.sleep(0.5)
        return [{"i": i, "j": j} for j in range(1000)]

    backend = create_backend("threadpool", max_parallelism=3, progress=False)
    ds = Dataset.from_list([0, 1, 2]).flat_map(slow_or_bad).write_jsonl(str(tmp_path / "p-{shard}.jsonl"))
    with pytest.raises(ShardError, match="bad shard"):
        list(backend.execute(ds))
    settled = sorted(p.name for p in tmp_path.iterdir())
    time.sleep(0.8)
    assert sorted(p.name for p in tmp_path.iterdir()) == settled  # nothing still running
    assert all(not name.startswith(".") for name in settled if name != RECORD_NAME)


def test_memory_upload_is_never_seen_partial():
    """On memory:// (fsspec's default put_file: open the target, copy blocks into it) the
    object used to appear empty and grow while it was copied, so an interrupt mid-copy left a
    partial output that a skip_existing rerun kept. Whenever the path exists it is whole."""
    import threading

    import fsspec

    fs = fsspec.filesystem("memory")
    path, size = "/zephyr-test-upload/out.bin", 128 << 20
    seen, done = [], threading.Event()

    def watch():
        while not done.is_set():
            if fs.exists(path):
                seen.append(fs.size(path))
                return

    watcher = threading.Thread(target=watch, daemon=True)
    watcher.start()
    try:
        with atomic_write(f"memory://{path}") as f:
            block = bytes(range(256)) * 4096
            for _ in range(size // len(block)):
                f.write(block)
        watcher.join(timeout=60)
        assert seen, "the watcher never saw the output"  # the check ran
        assert seen[0] == size and fs.size(path) == size
    finally:
        done.set()
        fs.rm(path.rsplit("/", 1)[0], recursive=True)
