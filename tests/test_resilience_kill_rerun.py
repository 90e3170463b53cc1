"""SIGKILL the driver of a multi-stage pipeline at different moments; the same command finishes,
writes the same bytes as an uninterrupted run, and does not redo completed work."""

import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from zephyr.status import RECORD_NAME  # the run record beside outputs is not an output

pytestmark = [pytest.mark.resilience, pytest.mark.slow]

NUM_MAP, NUM_REDUCE = 8, 4

PIPELINE = textwrap.dedent(
    f"""
    import sys, time
    from zephyr import Dataset, counters, create_backend

    CALLS = {{"map": 0, "reduce": 0}}  # user-function calls made by this process

    def tokenize(i):
        CALLS["map"] += 1
        counters.increment("map_calls")
        time.sleep(0.3)
        return [{{"w": f"w{{(i * 7 + j) % 23}}", "i": i, "j": j}} for j in range(40)]

    def count(key, items):
        return {{"w": key, "n": sum(1 for _ in items)}}

    def mark_reduce_shard(items):
        CALLS["reduce"] += 1
        counters.increment("reduce_shards")
        time.sleep(0.5)
        yield from items

    out, scratch = sys.argv[1], sys.argv[2]
    backend = create_backend("threadpool", max_parallelism=2, progress=False, scratch_dir=scratch)
    ds = (
        Dataset.from_list(list(range({NUM_MAP})))
        .flat_map(tokenize)
        .group_by(lambda r: r["w"], count, num_output_shards={NUM_REDUCE})
        .map_shard(mark_reduce_shard)
        .write_jsonl(out + "/part-{{shard}}.jsonl.zst", skip_existing=True)
    )
    execution = backend.execute(ds)
    list(execution)
    print("map_calls", CALLS["map"], "reduce_shards", CALLS["reduce"])
    print("counted", execution.counters["map_calls"])
    """
)


@pytest.fixture
def job(tmp_path):
    script = tmp_path / "job.py"
    script.write_text(PIPELINE)
    return script


@pytest.fixture
def start(background):
    """Start the job in the background; whatever the test does, it is killed afterwards."""
    return lambda script, out, scratch: background(
        [sys.executable, str(script), str(out), str(scratch)], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )


def finish(script, out, scratch):
    result = subprocess.run([sys.executable, str(script), str(out), str(scratch)], capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-3000:]
    words = result.stdout.split()
    return tuple(int(words[words.index(name) + 1]) for name in ("map_calls", "reduce_shards", "counted"))


def manifests(scratch: Path) -> int:
    return len(list(scratch.glob("*/map-*.json"))) if scratch.exists() else 0


def outputs(out: Path) -> list[str]:
    return sorted(p.name for p in out.iterdir() if not p.name.startswith(".")) if out.exists() else []


def beside(names) -> list[str]:
    """What a finished skip_existing run leaves: its outputs, each with the hidden record of
    the input it was made from (`.<name>.zephyr-source.json`)."""
    return sorted([*names, *(f".{name}.zephyr-source.json" for name in names)])


def wait_while_running(proc, condition, what, timeout=300):
    """Poll `condition()` every 20 ms until it holds; fail if the job ends first or it never does."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            raise AssertionError(f"the job ended before the kill point ({what}): {proc.communicate()}")
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout}s for the kill point: {what}")
        time.sleep(0.02)


def kill_when(proc, condition, what, timeout=300):
    """SIGKILL the job once `condition()` holds; fail if it never does."""
    wait_while_running(proc, condition, what, timeout)
    os.kill(proc.pid, signal.SIGKILL)
    assert_killed(proc, what)


def assert_killed(proc, what):
    """The kill landed: the job died of it, it had not already exited (a finished job, not yet
    reaped, ignores the signal)."""
    proc.wait()
    assert proc.returncode == -signal.SIGKILL, (
        f"the job exited ({proc.returncode}) before the kill ({what}): {proc.communicate()}")


@pytest.fixture(scope="module")
def reference(tmp_path_factory):
    root = tmp_path_factory.mktemp("reference")
    script = root / "job.py"
    script.write_text(PIPELINE)
    assert finish(script, root / "out", root / "scratch") == (NUM_MAP, NUM_REDUCE, NUM_MAP)
    return {name: (root / "out" / name).read_bytes() for name in outputs(root / "out")}


PHASES = {
    "during the first stage": lambda out, scratch: 2 <= manifests(scratch) < NUM_MAP,
    "between scatter and reduce": lambda out, scratch: manifests(scratch) == NUM_MAP and not outputs(out),
    "during the final write": lambda out, scratch: 1 <= len(outputs(out)) < NUM_REDUCE,
}


@pytest.mark.parametrize("phase", list(PHASES))
def test_killed_driver_resumes_without_redoing_finished_work(job, start, tmp_path, reference, phase):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    proc = start(job, out, scratch)
    kill_when(proc, lambda: PHASES[phase](out, scratch), phase)
    scattered, written = manifests(scratch), len(outputs(out))
    map_calls, reduce_shards, counted = finish(job, out, scratch)
    assert map_calls == NUM_MAP - scattered  # finished map shards are not redone
    assert counted == NUM_MAP  # yet every map shard is counted once (resumed ones from their manifests)
    assert reduce_shards == NUM_REDUCE - written  # finished outputs are not redone
    assert {name: (out / name).read_bytes() for name in outputs(out)} == reference
    assert sorted(p.name for p in out.iterdir() if p.name != RECORD_NAME) == beside(reference)  # no temporaries or lease left
    assert not any(scratch.iterdir())  # scratch removed after success


@pytest.mark.parametrize("seed", [3, 11])
def test_killed_at_a_random_moment(job, start, tmp_path, reference, seed):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    proc = start(job, out, scratch)
    # a random moment of the job's work: counted from its first scatter run, not from the
    # process start, which a loaded machine may spend entirely on imports
    wait_while_running(proc, scratch.exists, "the job's first scatter run")
    delay = random.Random(seed).uniform(0.0, 2.2)
    time.sleep(delay)
    os.kill(proc.pid, signal.SIGKILL)
    assert_killed(proc, f"{delay:.2f}s after the first scatter run")
    scattered, written = manifests(scratch), len(outputs(out))
    map_calls, reduce_shards, _ = finish(job, out, scratch)
    if written < NUM_REDUCE:
        assert map_calls == NUM_MAP - scattered
        assert reduce_shards == NUM_REDUCE - written
    assert {name: (out / name).read_bytes() for name in outputs(out)} == reference


def test_rerunning_a_finished_job_does_no_work(job, tmp_path, reference):
    out, scratch = tmp_path / "out", tmp_path / "scratch"
    assert finish(job, out, scratch) == (NUM_MAP, NUM_REDUCE, NUM_MAP)
    assert finish(job, out, scratch) == (0, 0, 0)
