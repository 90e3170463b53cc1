"""A Ray worker process of a run that crashes is never silent (issue 38), though Ray hides it.

A worker that dies mid-task is retried by Ray itself (`ray_task_retries`), so the run succeeds
and the runner counts nothing lost; a worker that crashes while exiting after its tasks shows
only in the crash dump Ray forwards to the driver. Each is reported in the status, the record
and the summary (`zephyr.backends.ray_crashes`). The faults are real: `os.abort()` in a worker.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from zephyr import Dataset, create_backend
from zephyr.execution.summary import format_summary
from zephyr.status import read_run_record

pytestmark = [pytest.mark.ray, pytest.mark.slow]

REPO = Path(__file__).resolve().parents[3]


def abort_once(item):
    """Item 1 aborts its worker process on the first attempt, after writing down its pid."""
    marker, x = item
    if x == 1 and not os.path.exists(marker):
        with open(marker, "w") as f:
            f.write(str(os.getpid()))
        os.abort()
    return {"x": x}


def test_a_worker_that_crashed_mid_task_is_reported_though_ray_retried_its_task(ray_shared, tmp_path):
    """Regression: Ray retried the task of a worker that died by SIGABRT and the run succeeded
    without a word (the status counted nothing lost)."""
    marker = str(tmp_path / "aborted")
    ds = Dataset.from_list([(marker, x) for x in range(4)]).map(abort_once).write_jsonl(str(tmp_path / "out" / "p-{shard}.jsonl"))
    backend = create_backend("ray", progress=False)  # Ray retries a lost task itself (ray_task_retries=3)
    try:
        execution = backend.execute(ds)
        assert len(list(execution)) == 4
        pid = int(Path(marker).read_text())  # the fault landed: that worker aborted
        snapshot = execution.status.snapshot()
        assert snapshot["stages"][0]["shards"]["lost"] == 0  # hidden from the runner: Ray retried it
        [crash] = snapshot["crashes"]
        assert (crash["pid"], crash["exit"]) == (pid, "SYSTEM_ERROR")
        assert f"CRASHED during the run: Ray worker pid {pid} on {crash['host']}" in format_summary(execution)
        assert read_run_record(str(tmp_path / "out"))["crashes"] == snapshot["crashes"]
    finally:
        backend.close()


CRASH_ON_EXIT = textwrap.dedent(
    """
    import atexit, os, sys, time
    import ray
    from zephyr import Dataset, create_backend
    from zephyr.status.crashes import describe_crash

    gate = sys.argv[1]

    def crash_on_exit(x):
        # this worker aborts when it exits (as Ray's C++ shutdown did with "Mutex corrupt"); first
        # all 8 tasks run at once, so that 8 workers start and the idle ones are later let go
        atexit.register(os.abort)
        open(f"{gate}/{x}", "w").close()
        deadline = time.monotonic() + 120
        while len(os.listdir(gate)) < 8 and time.monotonic() < deadline:
            time.sleep(0.05)
        return {"x": x, "pid": os.getpid()}

    ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=True)  # never another test's Ray
    backend = create_backend("ray", progress=False, num_cpus=0.25)
    start = time.time()
    results = list(backend.execute(Dataset.from_list(list(range(8))).map(crash_on_exit)))
    print("pids", sorted({r["pid"] for r in results}), flush=True)
    deadline = time.monotonic() + 120  # Ray lets idle workers above its 2 CPUs go after a second
    while not (crashes := backend.process_crashes(start)) and time.monotonic() < deadline:
        time.sleep(0.2)
    for crash in crashes:
        print("reported", crash["pid"], crash["exit"], describe_crash(crash), flush=True)
    backend.close()
    """
)


def test_a_worker_that_crashed_while_exiting_is_reported_from_its_forwarded_crash_dump(tmp_path):
    """A worker that aborts while exiting after its tasks (Ray records an intended, idle exit)
    shows only in the dump Ray forwards to the driver: that is read, and reported."""
    (tmp_path / "gate").mkdir()
    script = tmp_path / "crash_on_exit.py"
    script.write_text(CRASH_ON_EXIT)
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    done = subprocess.run([sys.executable, str(script), str(tmp_path / "gate")], cwd=tmp_path, env=env, capture_output=True,
                          text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-3000:]
    pids = {int(p) for p in done.stdout.split("pids [")[1].split("]")[0].split(",")}
    reported = [line.split() for line in done.stdout.splitlines() if line.startswith("reported ")]
    assert reported, done.stdout[-2000:] + done.stderr[-3000:]
    for _, pid, exit_type, *_ in reported:
        assert int(pid) in pids and exit_type == "None"  # Ray's own record: an intended exit
    assert "crashed, by the crash dump it logged" in done.stdout and "SIGABRT received" in done.stdout
    # reported once, by the call that found it: the close does not report those again (it may
    # report a worker that crashed later, while the idle ones were let go)
    again = [line for line in done.stderr.splitlines() if line.startswith("zephyr: after the run")]
    assert not [line for line in again for _, pid, *_ in reported if f" pid {pid} " in line], again
