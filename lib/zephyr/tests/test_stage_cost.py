"""Cost per stage (issue 29): CPU seconds, peak RSS, bytes, shuffle bytes and retries by cause,
measured in the tasks and shown in the summary, `zephyr status`, the snapshot and the run
record; a price per core-hour turns CPU seconds into a cost; two runs compare from their records.

Oracles are computed apart: the CPU a task burns by its own clock, the memory it touches, the
sizes of the files on disk, the attempts a test function failed on purpose.
"""

from __future__ import annotations

import json
import os
import time

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zephyr import Dataset, create_backend
from zephyr.cost import PRICE_ENV, StageCost, price_from_env
from zephyr.execution.summary import format_summary
from zephyr.execution.usage import process_rss
from zephyr.resources import format_bytes
from zephyr.status.commands import status_main
from zephyr.status.costs import compare_runs
from zephyr.status.record import read_run_record
from zephyr.tasks import ShardResult, TaskUsage

MIB = 1 << 20
SPIN = 0.15  # CPU seconds each task burns
TOUCH = 64 * MIB  # bytes each task holds at once


def _backend(name: str, request, **options):
    if name == "ray":
        request.getfixturevalue("ray_shared")
    if name == "threadpool":
        options.setdefault("max_parallelism", 1)  # one task at a time: its process's figures are its own
    return create_backend(name, progress=False, **options)


BACKENDS = ["sync", "threadpool", pytest.param("ray", marks=pytest.mark.ray)]


def spin_and_hold(item):
    """Burn SPIN seconds of this thread's CPU while holding TOUCH bytes (every page touched)."""
    held = bytearray(TOUCH)
    held[:: 4096] = b"x" * len(held[:: 4096])
    start = time.thread_time()
    while time.thread_time() - start < SPIN:
        pass
    return {"i": item, "held": len(held)}


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_each_stage_reports_cpu_seconds_and_peak_rss(backend_name, request, tmp_path):
    backend = _backend(backend_name, request)
    out = tmp_path / "out"
    execution = backend.execute(Dataset.from_list([0, 1, 2]).map(spin_and_hold).write_jsonl(str(out / "{shard}.jsonl")))
    list(execution)
    cost = execution.stats[0].cost
    assert cost.tasks == 3
    assert cost.cpu_s >= 3 * SPIN  # each task's own clock said it burned SPIN; process CPU is at least that
    assert cost.peak_rss >= TOUCH
    if backend_name == "ray":  # a worker runs one task at a time (in the driver, an earlier test's thread may linger)
        assert not cost.peak_rss_shared
    assert cost.task_s > 0
    # the same figures in the snapshot and the run record
    record = read_run_record(str(out))
    assert record["stages"][0]["cost"] == execution.status.snapshot()["stages"][0]["cost"]
    assert record["stages"][0]["cost"]["cpu_s"] == pytest.approx(cost.cpu_s, abs=1e-3)
    assert record["stages"][0]["cost"]["peak_rss"] == cost.peak_rss
    assert "cost: cpu" in format_summary(execution)


def _write_inputs(directory, files: int, rows: int) -> list[str]:
    directory.mkdir()
    paths = []
    for f in range(files):
        path = directory / f"in-{f}.jsonl"
        path.write_text("".join(json.dumps({"k": (f * rows + r) % 5, "v": "y" * (r % 40)}) + "\n" for r in range(rows)))
        paths.append(str(path))
    return paths


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_bytes_read_are_the_files_sizes_as_stored_and_decoded_bytes_their_contents(backend_name, request, tmp_path):
    """Regression (issue 38): `zephyr/bytes_read` counted JSON Lines' decompressed bytes (docs said
    compressed in one place, decoded in another): the summary said "read 42.8 MB" for 15 MB of
    files. It is now the bytes fetched from storage; `zephyr/bytes_decoded` is what they held."""
    import gzip

    import zstandard

    (tmp_path / "in").mkdir()
    contents = {}
    for i, (suffix, compress) in enumerate([("", bytes), (".gz", gzip.compress), (".zst", zstandard.compress)]):
        text = "".join(json.dumps({"i": i, "r": r, "text": "word " * (r % 50)}) + "\n" for r in range(2000)).encode()
        path = tmp_path / "in" / f"part-{i}.jsonl{suffix}"
        path.write_bytes(compress(text))
        contents[path] = len(text)
    stored = sum(os.path.getsize(p) for p in contents)
    assert stored < 0.7 * sum(contents.values())  # compression shows: the two counts differ
    ds = Dataset.from_files(str(tmp_path / "in" / "part-*")).load_jsonl().map(lambda r: r["i"])
    execution = _backend(backend_name, request).execute(ds)
    assert sorted(execution) == [0] * 2000 + [1] * 2000 + [2] * 2000
    assert execution.counters["zephyr/bytes_read"] == stored
    assert execution.counters["zephyr/bytes_decoded"] == sum(contents.values())
    cost = execution.stats[0].cost
    assert (cost.bytes_read, cost.bytes_decoded) == (stored, sum(contents.values()))
    line = next(line for line in format_summary(execution).splitlines() if "cost:" in line)
    assert f"read {format_bytes(stored)} ({format_bytes(sum(contents.values()))} decoded) / wrote" in line


def _count(k, items):
    return {"k": k, "n": sum(1 for _ in items)}


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_bytes_read_written_and_shuffled_per_stage(backend_name, request, tmp_path):
    inputs = _write_inputs(tmp_path / "in", files=3, rows=400)
    out = tmp_path / "out"
    ds = (Dataset.from_files(str(tmp_path / "in" / "*.jsonl")).load_jsonl()
          .group_by(lambda r: r["k"], _count, num_output_shards=2).write_jsonl(str(out / "part-{shard}.jsonl")))
    execution = create_backend(backend_name, progress=False).execute(ds)
    list(execution)
    scatter, reduce = execution.stats[0].cost, execution.stats[-1].cost
    assert scatter.bytes_read == sum(os.path.getsize(p) for p in inputs)
    outputs = sorted(out.glob("part-*.jsonl"))
    assert reduce.bytes_written == sum(p.stat().st_size for p in outputs)
    assert scatter.shuffle_bytes_written > 0
    assert reduce.shuffle_bytes_read == scatter.shuffle_bytes_written  # every run byte is read once
    assert scatter.bytes_written > scatter.shuffle_bytes_written  # runs plus the map manifests


def fail_first_attempts(item):
    """Shard 1 fails its first attempt with a user error, shard 2 with a MemoryError; the
    markers (files) say which attempts ran."""
    marker = os.path.join(item["dir"], f"tried-{item['i']}")
    first = not os.path.exists(marker)
    open(marker, "a").close()
    if first and item["i"] == 1:
        raise ValueError("flaky on the first attempt")
    if first and item["i"] == 2:
        raise MemoryError("cannot allocate the working set")
    return {"i": item["i"]}


@pytest.mark.parametrize("backend_name", BACKENDS)
def test_retries_are_counted_by_cause(backend_name, request, tmp_path):
    backend = _backend(backend_name, request, max_user_retries=1)
    out = tmp_path / "out"
    items = [{"i": i, "dir": str(tmp_path)} for i in range(3)]
    execution = backend.execute(Dataset.from_list(items).map(fail_first_attempts).write_jsonl(str(out / "{shard}.jsonl")))
    list(execution)
    assert all((tmp_path / f"tried-{i}").exists() for i in range(3))  # the faults landed
    retries = execution.stats[0].cost.retries
    assert retries == {"user": 1, "lost": 0, "storage": 0, "memory": 1}
    assert read_run_record(str(out))["stages"][0]["cost"]["retries"] == retries
    record = read_run_record(str(out))
    shards = record["stages"][0]["shards"]
    assert (shards["retried_user"], shards["user_errors"]) == (1, 1)  # the memory retry is not the user's
    assert sorted((f["shard"], f["cause"], f["outcome"]) for f in record["failures"]) == [(1, "user", "retried"),
                                                                                         (2, "memory", "retried")]


@pytest.mark.parametrize("backend_name", ["sync", "threadpool"])
def test_out_of_memory_at_the_ceiling_counts_as_the_users_retry_everywhere(backend_name, request, tmp_path):
    """Regression: an attempt out of memory at its ceiling (`memory` set) is not retried with more
    memory but charged to the user's retries (the summary's "retried 1 failed", the cost's
    retries["user"]), yet the status and the record counted no user error and no user retry."""
    backend = _backend(backend_name, request, max_user_retries=1, memory="64MiB")
    out = tmp_path / "out"
    items = [{"i": i, "dir": str(tmp_path)} for i in range(3)]
    execution = backend.execute(Dataset.from_list(items).map(fail_first_attempts).write_jsonl(str(out / "{shard}.jsonl")))
    list(execution)
    stats = execution.stats[0]
    assert stats.cost.retries == {"user": 2, "lost": 0, "storage": 0, "memory": 0}  # shard 1's and shard 2's
    shards = read_run_record(str(out))["stages"][0]["shards"]
    assert (shards["user_errors"], shards["retried_user"]) == (2, 2) == (stats.retries_user, stats.retries_user)
    assert "retried 2 failed / 0 lost" in format_summary(execution)


def burn(item):
    start = time.thread_time()
    while time.thread_time() - start < item["spin"]:
        pass
    return item


def _run(tmp_path, name: str, spin: float, **options) -> str:
    out = tmp_path / name
    items = [{"i": i, "spin": spin} for i in range(2)]
    list(create_backend("sync", progress=False, **options).execute(
        Dataset.from_list(items).map(burn).write_jsonl(str(out / "{shard}.jsonl"))))
    return str(out)


def test_price_per_core_hour_turns_cpu_seconds_into_cost(tmp_path, monkeypatch, capsys):
    monkeypatch.delenv(PRICE_ENV, raising=False)
    out = _run(tmp_path, "priced", 0.05, price_per_core_hour=7.2)
    record = read_run_record(out)
    assert record["price_per_core_hour"] == 7.2
    cost = record["stages"][0]["cost"]
    assert cost["cost"] == pytest.approx(cost["cpu_s"] / 3600 * 7.2, abs=1e-5)
    assert record["cost"]["cost"] == pytest.approx(cost["cost"], abs=1e-6)
    assert status_main([out]) == 0
    text = capsys.readouterr().out
    assert "cost: cpu" in text and "at 7.2 per core-hour" in text

    assert read_run_record(_run(tmp_path, "unpriced", 0.0))["stages"][0]["cost"]["cost"] is None


def test_price_from_the_environment(monkeypatch):
    monkeypatch.setenv(PRICE_ENV, "0.25")
    assert create_backend("sync").price_per_core_hour == 0.25
    assert create_backend("sync", price_per_core_hour=1.5).price_per_core_hour == 1.5  # the option wins
    monkeypatch.setenv(PRICE_ENV, "cheap")
    with pytest.raises(ValueError, match=f"{PRICE_ENV} must be a number"):
        price_from_env()
    with pytest.raises(ValueError, match="price_per_core_hour must be a finite number >= 0"):
        create_backend("sync", price_per_core_hour=-1)


def test_zephyr_status_compares_two_runs_from_their_records(tmp_path, capsys):
    a, b = _run(tmp_path, "a", 0.05), _run(tmp_path, "b", 0.2)
    assert status_main(["--compare", a, b, "--json"]) == 0
    compared = json.loads(capsys.readouterr().out)
    ra, rb = read_run_record(a), read_run_record(b)
    [stage] = compared["stages"]
    figures = {f["figure"]: f for f in stage["figures"]}
    cpu_a, cpu_b = ra["stages"][0]["cost"]["cpu_s"], rb["stages"][0]["cost"]["cpu_s"]
    assert (figures["cpu_s"]["a"], figures["cpu_s"]["b"]) == (cpu_a, cpu_b)
    assert figures["cpu_s"]["ratio"] == pytest.approx(cpu_b / cpu_a)
    assert figures["cpu_s"]["ratio"] > 2  # 0.4 s burned against 0.1 s
    assert figures["items_out"]["ratio"] == 1.0
    assert status_main(["--compare", a, b]) == 0
    text = capsys.readouterr().out
    assert "B/A" in text and "cpu_s" in text and f"{cpu_b / cpu_a:.2f}x" in text
    assert status_main(["--compare", a, str(tmp_path / "missing")]) == 1
    assert "no run record" in capsys.readouterr().err


@settings(max_examples=30)
@given(st.lists(st.tuples(st.floats(0, 100), st.integers(0, 1 << 40), st.integers(0, 1 << 30), st.booleans()), max_size=12))
def test_stage_cost_adds_up_like_plain_sums(tasks):
    cost = StageCost()
    for cpu, peak, written, shared in tasks:
        usage = TaskUsage(cpu_s=cpu, peak_rss=peak, shared=shared)
        cost.add(ShardResult(0, None, counters={"zephyr/bytes_written": written}, elapsed=1.0, usage=usage))
    assert cost.tasks == len(tasks)
    assert cost.cpu_s == pytest.approx(sum(t[0] for t in tasks))
    assert cost.peak_rss == max((t[1] for t in tasks), default=0)
    assert cost.bytes_written == sum(t[2] for t in tasks)


@settings(max_examples=30)
@given(st.lists(st.floats(0.001, 1e6), min_size=2, max_size=2))
def test_compare_ratio_is_b_over_a(values):
    a, b = ({"stages": [{"index": 0, "cost": {"cpu_s": v}}]} for v in values)
    [row] = compare_runs(a, b)
    ratio = next(f["ratio"] for f in row["figures"] if f["figure"] == "cpu_s")
    assert ratio == pytest.approx(values[1] / values[0])


def test_the_command_line_takes_a_price(tmp_path, monkeypatch):
    from zephyr.cli import build_parser, make_backend

    monkeypatch.delenv(PRICE_ENV, raising=False)
    script = str(tmp_path / "s.py")
    args = build_parser().parse_args(["--backend=sync", "--price-per-core-hour", "0.5", script])
    assert make_backend(args).price_per_core_hour == 0.5
    assert make_backend(build_parser().parse_args(["--backend=sync", script])).price_per_core_hour is None
    with pytest.raises(SystemExit):
        build_parser().parse_args(["--backend=sync", "--price-per-core-hour", "-1", script])


def _split_cost(ds, split: int):
    """`ds` on the sync backend, its per-item ops split over `split` processes (1: none), and the stage's cost."""
    backend = create_backend("sync", progress=False)
    backend.intra_shard_workers = split  # what ZephyrContext(intra_shard_execution="auto", max_workers=split) sets
    try:
        execution = backend.execute(ds)
        items = list(execution)
        return items, execution.stats[0].cost
    finally:
        backend.close()


def test_a_split_stage_counts_the_cpu_its_chunk_processes_burn():
    """The oracle is the same stage run in its task: the work is the same, wherever it ran."""
    ds = Dataset.from_list([[{"i": i, "spin": 0.01} for i in range(60)]]).flat_map(list).map(burn)
    plain_items, plain = _split_cost(ds, 1)
    split_items, split = _split_cost(ds, 2)
    assert split_items == plain_items
    assert plain.cpu_s >= 0.6  # each item's own clock said it burned 10 ms
    assert split.cpu_s >= 0.3 * plain.cpu_s  # before: the task's idle thread only, ~0.02 s


SPLIT_HOLD = 256 * MIB


def hold_while_mapping(x):
    """Hold SPLIT_HOLD bytes (every page touched) while mapping item 0."""
    if x == 0:
        held = bytearray(SPLIT_HOLD)
        held[:: 4096] = b"x" * len(held[:: 4096])
        return len(held)
    return x


def test_a_split_stage_peak_covers_what_a_chunk_process_held():
    """A chunk process held SPLIT_HOLD bytes while the task's process was alive beside it: the
    task's footprint (what its memory budget must hold) is at least the two together."""
    task_rss = process_rss()  # the task runs in this process (sync backend)
    items, cost = _split_cost(Dataset.from_list([list(range(50))]).flat_map(list).map(hold_while_mapping), 2)
    assert items == [SPLIT_HOLD] + list(range(1, 50))
    assert cost.peak_rss >= task_rss + SPLIT_HOLD  # before: this process's own peak only
