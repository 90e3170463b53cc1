"""SIGINT/SIGTERM to a `zephyr` run mid-stage: it cancels its in-flight tasks, leaves only complete
outputs, says it was interrupted, exits 130/143, and a rerun writes what a clean run writes.

Regression for issue 21 (3): SIGTERM killed the driver outright (its writers' temporaries stayed
in the output directory), and on the threadpool backend a SIGINT left the running shards going:
the command waited for them (here: forever, as they wait for a gate that never opens).

Shards 1-3 of the pipeline block on their sixth item until a gate file appears (shard 0 does
not), so at the signal one output is complete and two writers are mid-file.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

PIPELINE = textwrap.dedent(
    """
    import os, sys, time
    from zephyr import Dataset, flow_backend

    MARKS, GATE = os.environ["MARKS_DIR"], os.environ["GATE"]

    def expand(chunk):
        return chunk

    def slow(x):
        if x % 10 == 5 and x >= 10:  # shards 1..3 wait on their sixth item: their writers are mid-file
            open(os.path.join(MARKS, f"waiting-{x}"), "w").close()
            try:
                while not os.path.exists(GATE):
                    time.sleep(0.05)
            except BaseException as e:
                open(os.path.join(MARKS, f"stopped-{x}-{type(e).__name__}"), "w").close()
                raise
        return {"x": x, "square": x * x}

    def main():
        out = sys.argv[sys.argv.index("--out") + 1]
        chunks = [list(range(i * 10, i * 10 + 10)) for i in range(4)]
        ds = Dataset.from_list(chunks).flat_map(expand).map(slow).write_jsonl(out + "/part-{shard:05d}.jsonl")
        list(flow_backend().execute(ds))
    """
)


def expected_shard(shard: int) -> list[dict]:
    """The oracle: what shard `shard` holds, in plain Python."""
    return [{"x": x, "square": x * x} for x in range(shard * 10, shard * 10 + 10)]


def read_jsonl(path: Path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()]


class Run:
    def __init__(self, tmp_path: Path, backend_args: list[str], env: dict | None = None):
        self.script = tmp_path / "pipeline.py"
        self.script.write_text(PIPELINE)
        self.marks = tmp_path / "marks"
        self.marks.mkdir()
        self.gate = tmp_path / "gate"
        self.out = tmp_path / "out"
        self.env = {**os.environ, "MARKS_DIR": str(self.marks), "GATE": str(self.gate), **(env or {})}
        self.backend_args = backend_args

    def args(self, out: Path) -> list[str]:
        return [sys.executable, "-m", "zephyr", *self.backend_args, "--max-parallelism=2", "--quiet",
                str(self.script), "--out", str(out)]

    def marked(self, prefix: str) -> list[str]:
        return sorted(p.name for p in self.marks.iterdir() if p.name.startswith(prefix))

    def temporaries(self) -> list[str]:
        return sorted(p.name for p in self.out.iterdir() if ".zephyr-tmp-" in p.name) if self.out.exists() else []


def interrupt_mid_stage(run: Run, background, wait_until, signal_and_wait, signum: int, before_signal=None) -> str:
    """Start the run, wait until two writers are mid-file, send `signum` (`signal_and_wait(proc,
    signum)` -> seconds to the exit), check what it left; returns the run's stderr."""
    proc = background(run.args(run.out), env=run.env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    wait_until(lambda: len(run.marked("waiting-")) == 2 and len(run.temporaries()) == 2,
               "two shards to block mid-write")
    if before_signal is not None:
        before_signal(proc)
    seconds = signal_and_wait(proc, signum)
    stderr = proc.stderr.read()
    print(f"\n{' '.join(run.backend_args)} {signal.Signals(signum).name}: exited {proc.returncode} after {seconds:.2f}s")
    assert proc.returncode == 128 + signum, stderr[-3000:]
    assert f"interrupted by {signal.Signals(signum).name}" in stderr
    # the cancel reached the running shards (they raised inside the user's function)
    assert len(run.marked("stopped-")) == 2, run.marked("")
    # only complete outputs: shard 0 finished before the signal; no temporaries, no partial files
    assert sorted(p.name for p in run.out.iterdir()) == [".zephyr-run.json", "part-00000.jsonl"]
    assert read_jsonl(run.out / "part-00000.jsonl") == expected_shard(0)
    record = json.loads((run.out / ".zephyr-run.json").read_text())
    assert record["state"] == "interrupted"
    assert record["error"]["type"] in ("Interrupted", "KeyboardInterrupt")  # Ray's waits re-raise it bare
    return stderr


@pytest.fixture(scope="module")
def clean_out(tmp_path_factory) -> Path:
    """The outputs of one uninterrupted run (threadpool, the gate open), for the module: what a
    rerun after an interrupt must write, byte for byte, on any backend."""
    run = Run(tmp_path_factory.mktemp("clean"), ["--backend=threadpool"])
    run.gate.touch()
    clean = subprocess.run(run.args(run.out), env=run.env, capture_output=True, text=True, timeout=300)
    assert clean.returncode == 0, clean.stderr[-3000:]
    return run.out


def rerun_matches_a_clean_run(run: Run, clean_out: Path) -> None:
    run.gate.touch()
    rerun = subprocess.run(run.args(run.out), env=run.env, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr[-3000:]
    names = [f"part-{i:05d}.jsonl" for i in range(4)]
    assert sorted(p.name for p in run.out.iterdir() if not p.name.startswith(".")) == names
    assert not run.temporaries()
    for shard, name in enumerate(names):
        assert read_jsonl(run.out / name) == expected_shard(shard)
        assert (run.out / name).read_bytes() == (clean_out / name).read_bytes()
    assert json.loads((run.out / ".zephyr-run.json").read_text())["state"] == "succeeded"


@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_threadpool_run_interrupted_mid_stage(tmp_path, background, wait_until, signal_and_wait, signum, clean_out):
    run = Run(tmp_path, ["--backend=threadpool"])
    interrupt_mid_stage(run, background, wait_until, signal_and_wait, signum)
    rerun_matches_a_clean_run(run, clean_out)


# Prepended to PIPELINE: once the file $FIRE exists, the driver's main thread sends itself SIGINT
# from inside a garbage-collector callback, where the handler's exception is printed and dropped.
SIGNAL_INSIDE_GC = textwrap.dedent(
    """
    import gc, os, signal, threading

    def _signal_inside_gc(phase, info):
        fire = os.environ["FIRE"]
        if threading.current_thread() is threading.main_thread() and os.path.exists(fire) and not os.path.exists(fire + ".sent"):
            open(fire + ".sent", "w").close()
            signal.raise_signal(signal.SIGINT)
            for _ in range(100):  # bytecodes for the handler to run at, still inside the callback
                pass

    gc.callbacks.append(_signal_inside_gc)
    gc.set_threshold(1)  # collect at nearly every allocation, so the driver's wait loop soon runs it
    """
)


def test_an_interrupt_whose_exception_python_dropped_still_stops_the_run(tmp_path, background, wait_until, signal_and_wait,
                                                                         clean_out):
    """Regression: a SIGINT handled while the driver ran a gc callback (hypothesis installs one,
    so does any profiler) raised `Interrupted` there; Python printed and dropped it, the run went
    on, and every later Ctrl-C was taken for a second one and ignored."""
    fire = tmp_path / "fire"
    run = Run(tmp_path, ["--backend=threadpool"], env={"FIRE": str(fire)})
    run.script.write_text(SIGNAL_INSIDE_GC + PIPELINE)

    def fire_and_wait(proc, signum):
        fire.touch()
        return signal_and_wait(proc, 0)  # signal 0: sends nothing, waits for the exit

    stderr = interrupt_mid_stage(run, background, wait_until, fire_and_wait, signal.SIGINT)
    assert (tmp_path / "fire.sent").exists() and "Exception ignored" in stderr  # the fault landed: dropped in the callback
    run.script.write_text(PIPELINE)
    rerun_matches_a_clean_run(run, clean_out)


@pytest.mark.ray
@pytest.mark.parametrize("signum", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_ray_run_interrupted_mid_stage(tmp_path, background, wait_until, signal_and_wait, ray_shared, signum, clean_out):
    """On Ray the driver cancels the shard tasks (Ray raises KeyboardInterrupt in them) and waits for them."""
    address = ray_shared.get_runtime_context().gcs_address
    run = Run(tmp_path, ["--backend=ray", f"--address={address}"])
    interrupt_mid_stage(run, background, wait_until, signal_and_wait, signum)
    rerun_matches_a_clean_run(run, clean_out)


def descendants(pid: int) -> set[int]:
    """Every process below `pid` (from /proc), e.g. the embedded Ray a driver started."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                ppid = int(Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[1])
            except (OSError, IndexError, ValueError):
                continue
            children.setdefault(ppid, []).append(int(entry))
    found, todo = set(), [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.add(child)
            todo.append(child)
    return found


def running(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.ray
@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc"), reason="reads the process tree from /proc")
def test_interrupted_driver_shuts_down_its_embedded_ray(tmp_path, background, wait_until, signal_and_wait):
    """Without --address the command starts its own Ray; an interrupted run shuts it down: the
    Ray processes it started (GCS, raylet, dashboard and runtime-env agents, workers) all end.
    (A SIGKILLed driver cannot: its agents outlive it, see docs/zephyr.md.)"""
    run = Run(tmp_path, ["--backend=ray"], env={"RAY_ADDRESS": ""})
    ray_processes: set[int] = set()
    interrupt_mid_stage(run, background, wait_until, signal_and_wait, signal.SIGTERM,
                        before_signal=lambda proc: ray_processes.update(descendants(proc.pid)))
    assert len(ray_processes) >= 3  # at least the GCS, the raylet and a worker
    try:
        wait_until(lambda: not any(running(pid) for pid in ray_processes), "the embedded Ray's processes to end", 60)
    finally:
        for pid in ray_processes:  # only what this test's driver started
            if running(pid):
                os.kill(pid, signal.SIGKILL)
