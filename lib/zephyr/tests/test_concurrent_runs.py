"""Concurrent runs into one output never delete each other's work (issue 21, defect 7).

Regression: two runs into one directory, the first to finish deleted the other's in-progress
temporaries and the shared scratch; the other failed with a FileNotFoundError on a hidden
path (16 of 18 pairs) and 8 of 18 left scratch behind. Now a run holds a lease on its output
directory: the second fails at once naming the holder, or (started after) runs on its own.
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import orjson
import pytest

from zephyr import Dataset, OutputBusyError, create_backend
from zephyr.status import RECORD_NAME

NUM_MAP, NUM_REDUCE = 6, 3

RUN = textwrap.dedent(
    f"""
    import os, sys, time
    from zephyr import Dataset, OutputBusyError, create_backend

    def rows(i):
        time.sleep(0.2)  # long enough for two runs started together to overlap
        return [{{"k": (i * 7 + j) % 11, "i": i}} for j in range(30)]

    def count(key, items):
        return {{"k": key, "n": sum(1 for _ in items)}}

    def stall(i):
        print("RUNNING", flush=True)
        time.sleep(600)
        return i

    out, gate, mode = sys.argv[1], sys.argv[2], sys.argv[3]
    ds = Dataset.from_list(list(range({NUM_MAP})))
    ds = ds.map(stall) if mode == "stall" else ds
    ds = ds.flat_map(rows).group_by(lambda r: r["k"], count, num_output_shards={NUM_REDUCE}).write_jsonl(out + "/part-{{shard}}.jsonl")
    print("READY", flush=True)
    while not os.path.exists(gate):
        time.sleep(0.005)
    try:
        list(create_backend("threadpool", max_parallelism=2, memory="4MiB", progress=False).execute(ds))
    except OutputBusyError as e:
        print("BUSY", e, flush=True)
        sys.exit(3)
    print("DONE", flush=True)
    """
)


def oracle() -> list[dict]:
    """A clean run's records, in plain Python: how often each key occurs."""
    keys = [(i * 7 + j) % 11 for i in range(NUM_MAP) for j in range(30)]
    return sorted(({"k": k, "n": keys.count(k)} for k in set(keys)), key=lambda r: r["k"])


def records(out: Path) -> list[dict]:
    rows = [orjson.loads(line) for p in sorted(out.glob("part-*.jsonl")) for line in p.read_text().splitlines()]
    return sorted(rows, key=lambda r: r["k"])


def left_beside_outputs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if p.name != RECORD_NAME and not p.name.startswith("part-"))


def start(background, out: Path, gate: Path, mode: str = "run") -> subprocess.Popen:
    env = {**os.environ, "TMPDIR": str(gate.parent)}
    return background([sys.executable, "-c", RUN, str(out), str(gate), mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


@pytest.mark.slow
def test_two_runs_started_together_into_one_directory_never_break_each_other(tmp_path, background, wait_for_line):
    """5 pairs, released by one gate: one finishes and the other says another run is already
    running (or both finish, one after the other); the outputs equal a clean run's, and
    nothing but outputs and the run record is left."""
    outcomes = []
    for pair in range(5):
        out, gate = tmp_path / f"out{pair}", tmp_path / f"gate{pair}"
        procs = [start(background, out, gate) for _ in range(2)]
        for proc in procs:
            wait_for_line(proc, "READY")
        gate.touch()
        results = [(proc.wait(timeout=300), proc.stdout.read()) for proc in procs]
        codes = sorted(code for code, _ in results)
        assert codes in ([0, 0], [0, 3]), results
        for code, text in results:
            if code == 3:
                assert "another zephyr run is already running into" in text and f"{out}" in text, text
                assert "FileNotFoundError" not in text
        outcomes.append(codes)
        assert records(out) == oracle()
        assert left_beside_outputs(out) == []  # no scratch, temporaries or lease files
    assert [0, 3] in outcomes, outcomes  # the runs did overlap at least once


def test_a_second_run_into_a_busy_directory_fails_fast_naming_the_holder(tmp_path, background, wait_for_line):
    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.touch()
    holder = start(background, out, gate, "stall")
    wait_for_line(holder, "RUNNING")
    ds = Dataset.from_list([1, 2]).map(lambda i: {"i": i}).write_jsonl(str(out / "part-{shard}.jsonl"))
    with pytest.raises(OutputBusyError, match=rf"already running into {out}: .*:{holder.pid} since"):
        list(create_backend("sync", progress=False).execute(ds))
    assert not (out / "part-0.jsonl").exists()


def test_through_a_zephyr_context_a_busy_directory_is_refused_not_retried(tmp_path, background, wait_for_line, caplog):
    """Regression: ZephyrContext retried any RuntimeError as an infrastructure failure (up to 100
    times, backing off to a minute), so OutputBusyError was logged and retried, not raised."""
    from zephyr import ZephyrContext

    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.touch()
    holder = start(background, out, gate, "stall")
    wait_for_line(holder, "RUNNING")
    ds = Dataset.from_list([1, 2]).map(lambda i: {"i": i}).write_jsonl(str(out / "part-{shard}.jsonl"))
    caplog.set_level(logging.WARNING, logger="zephyr")
    with pytest.raises(OutputBusyError, match=rf"already running into {out}"):
        ZephyrContext(client="sync", max_workers=1, max_execution_retries=2).execute(ds)
    assert not [r for r in caplog.records if "run attempt" in r.getMessage()]  # refused on the first attempt
    assert not (out / "part-0.jsonl").exists()


def test_a_killed_holder_does_not_block_the_next_run(tmp_path, background, wait_for_line):
    """A SIGKILLed run leaves its claim; on the same host its dead pid frees it at once."""
    out, gate = tmp_path / "out", tmp_path / "gate"
    gate.touch()
    holder = start(background, out, gate, "stall")
    wait_for_line(holder, "RUNNING")
    holder.send_signal(signal.SIGKILL)
    holder.wait()
    assert list((out / ".zephyr-lease").iterdir())  # the fault landed: its claim is still there
    ds = Dataset.from_list(list(range(NUM_MAP))).flat_map(rows).group_by(lambda r: r["k"], count, num_output_shards=NUM_REDUCE)
    list(create_backend("sync", progress=False).execute(ds.write_jsonl(str(out / "part-{shard}.jsonl"))))
    assert records(out) == oracle()
    assert left_beside_outputs(out) == []


@pytest.mark.filterwarnings("ignore::zephyr.NotPicklableWarning")  # its reducer holds threading objects: in-process only
def test_runs_sharing_an_explicit_scratch_dir_into_different_outputs_both_finish(tmp_path, wait_until):
    """Both map to <scratch>/<stage fingerprint>. Run A, in its first reduce, lets run B go:
    B used to resume A's map output, finish and delete it under A's later reduce shards.
    Now B waits for A's lease on that scratch; both outputs equal a clean run's."""
    import logging
    import threading

    scratch = tmp_path / "scratch"
    results: dict[str, str] = {}
    peer_done, peer_waiting, started = threading.Event(), threading.Event(), []

    class Waiting(logging.Handler):
        def emit(self, record):
            if "waiting for the run" in record.getMessage():
                peer_waiting.set()

    def run(name, reducer):
        ds = Dataset.from_list(list(range(NUM_MAP))).flat_map(rows).group_by(lambda r: r["k"], reducer, num_output_shards=NUM_REDUCE)
        backend = create_backend("threadpool", max_parallelism=1, progress=False, scratch_dir=str(scratch))
        try:
            list(backend.execute(ds.write_jsonl(str(tmp_path / name / "part-{shard}.jsonl"))))
            results[name] = "ok"
        except Exception as e:  # noqa: BLE001 - reported by the assertion below
            results[name] = repr(e)

    def peer():
        run("b", count)
        peer_done.set()

    def count_after_peer(key, items):
        if not started:
            started.append(threading.Thread(target=peer))
            started[0].start()
            wait_until(lambda: peer_done.is_set() or peer_waiting.is_set(), "run B finished or waiting for A")
        return count(key, items)

    handler = Waiting()
    logging.getLogger("zephyr").addHandler(handler)
    try:
        run("a", count_after_peer)
        started[0].join(timeout=300)
    finally:
        logging.getLogger("zephyr").removeHandler(handler)
    assert results == {"a": "ok", "b": "ok"}
    assert peer_waiting.is_set()
    assert records(tmp_path / "a") == records(tmp_path / "b") == oracle()
    assert list(scratch.iterdir()) == []


def rows(i):
    return [{"k": (i * 7 + j) % 11} for j in range(30)]


def count(key, items):
    return {"k": key, "n": sum(1 for _ in items)}
