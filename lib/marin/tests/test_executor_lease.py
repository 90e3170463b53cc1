"""Executors in separate processes sharing a prefix: a step runs once; a dead holder's lease
is taken over. On local disk and on gs:// (the local GCS emulator)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from dataclasses import dataclass

import fsspec
import pytest

from marin.execution import Executor, ExecutorStep, Lease, StepStatus, read_status, this_output_path, versioned

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

# One experiment with one step "race"; the step leaves a file per run in $LOG_DIR and sleeps.
SCRIPT = textwrap.dedent(
    """
    import os, sys, time, uuid
    from dataclasses import dataclass
    from marin.execution import ExecutorStep, executor_main, this_output_path, versioned

    @dataclass(frozen=True)
    class Cfg:
        n: object
        output_path: object

    def work(config):
        with open(os.path.join(os.environ["LOG_DIR"], f"{os.getpid()}-{uuid.uuid4().hex}"), "w") as f:
            f.write(config.output_path)
        time.sleep(float(os.environ["STEP_SLEEP"]))

    if any(arg.startswith("gs://") for arg in sys.argv):
        import gcsfs  # slow to import: do it before the start line
    # Start line: wait until all $RACERS processes are ready, so they really race.
    ready_dir = os.environ["READY_DIR"]
    open(os.path.join(ready_dir, str(os.getpid())), "w").close()
    deadline = time.time() + 60
    while len(os.listdir(ready_dir)) < int(os.environ["RACERS"]) and time.time() < deadline:
        time.sleep(0.01)
    executor_main([ExecutorStep("race", work, Cfg(versioned(1), this_output_path()))], args=sys.argv[1:])
    """
)


@dataclass(frozen=True)
class Cfg:
    n: object
    output_path: object


@pytest.fixture(params=["local", "gs"])
def prefix(request, tmp_path):
    if request.param == "local":
        return str(tmp_path / "out")
    return request.getfixturevalue("gcs_bucket") + "/out"


def spawn(tmp_path, prefix, step_sleep, *flags, racers=1):
    script = tmp_path / "race.py"
    if not script.exists():  # written once: rewriting it under a starting process would run an empty file
        script.write_text(SCRIPT)
    (tmp_path / "ready").mkdir(exist_ok=True)
    env = dict(
        os.environ, LOG_DIR=str(tmp_path / "logs"), STEP_SLEEP=str(step_sleep), READY_DIR=str(tmp_path / "ready"), RACERS=str(racers)
    )
    return subprocess.Popen(
        [sys.executable, str(script), "--prefix", prefix, *flags],
        env=env,
        cwd=REPO_ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    )


@pytest.mark.slow
def test_ten_executors_race_for_one_step_and_it_runs_once(tmp_path, prefix):
    """Ten processes on local disk; four on gs:// (importing gcsfs costs ~2 CPU-s each)."""
    (tmp_path / "logs").mkdir()
    racers = 10 if prefix.startswith("/") else 4
    flags = ("--poll_interval", "0.1", "--heartbeat_interval", "0.2", "--lease_timeout", "5")
    procs = [spawn(tmp_path, prefix, 0.5, *flags, racers=racers) for _ in range(racers)]
    outputs = [p.communicate(timeout=300)[0] for p in procs]
    assert [p.returncode for p in procs] == [0] * racers, "\n".join(outputs)
    assert len(os.listdir(tmp_path / "logs")) == 1
    (output_path,) = {open(tmp_path / "logs" / name).read() for name in os.listdir(tmp_path / "logs")}
    assert read_status(output_path) == StepStatus.SUCCESS
    ran = [out for out in outputs if "succeeded: " in out and "already" not in out]
    assert len(ran) == 1, "\n".join(o for o in outputs if o not in ran)
    assert sum("already succeeded" in out for out in outputs) == racers - 1, "\n".join(outputs)


@pytest.mark.slow
def test_stale_lease_of_a_killed_executor_is_taken_over(tmp_path, prefix):
    (tmp_path / "logs").mkdir()
    holder = spawn(tmp_path, prefix, 60, "--heartbeat_interval", "0.2", "--lease_timeout", "1.0")
    deadline = time.monotonic() + 120
    while not os.listdir(tmp_path / "logs"):
        assert holder.poll() is None and time.monotonic() < deadline, holder.communicate()[0]
        time.sleep(0.05)
    holder.send_signal(signal.SIGKILL)  # dies holding the lease, status RUNNING
    holder.wait()

    def finish(config):
        with fsspec.open(f"{config.output_path}/done.txt", "w") as f:
            f.write("taken over")

    step = ExecutorStep("race", finish, Cfg(versioned(1), this_output_path()))  # same version: fn does not count
    executor = Executor(prefix, poll_interval=0.1, heartbeat_interval=0.2, lease_timeout=2.0, settle=0.2)
    (output_path,) = executor.plan([step]).steps and [executor.plan([step]).steps[0].output_path]
    assert read_status(output_path) == StepStatus.RUNNING
    started = time.monotonic()
    assert executor.run([step]) == {output_path: "SUCCESS"}
    assert time.monotonic() - started < 60  # soon after the dead holder's 1 s lease expired (loosely: a loaded machine)
    with fsspec.open(f"{output_path}/done.txt") as f:
        assert f.read() == b"taken over"
    lease = Lease(f"{output_path}/.executor_lease").current()
    assert lease["epoch"] == 2 and lease["released"] and lease["owner"].endswith(f":{os.getpid()}")


def test_lease_excludes_while_heartbeating_and_passes_on_release(prefix):
    directory = f"{prefix}/lease"
    # a timeout long enough that a heartbeat thread stalled by a loaded machine still makes it
    first = Lease(directory, "first", timeout=3.0, heartbeat_interval=0.1, settle=0.05)
    second = Lease(directory, "second", timeout=3.0, heartbeat_interval=0.1, settle=0.05)
    assert first.try_acquire() and first.epoch == 1
    assert not second.try_acquire()
    time.sleep(3.5)  # longer than the timeout: only the heartbeat keeps the lease live
    assert not second.try_acquire() and second.current()["owner"] == "first"
    first.release()
    assert not Lease.is_live(second.current())
    assert second.try_acquire() and second.epoch == 2
    second.release()
    with pytest.raises(ValueError, match="heartbeat_interval"):
        Lease(directory, timeout=1, heartbeat_interval=2)


@pytest.mark.parametrize("trial", range(3))
def test_simultaneous_acquires_have_one_winner(prefix, trial):
    """Threads released together try one fresh lease; exactly one gets it.

    Pins the claim rules: with a plain overwrite of one claim file several threads win."""
    threads_n = 16 if prefix.startswith("/") else 8
    barrier = threading.Barrier(threads_n)
    winners: list[Lease] = []

    def contend(i):
        lease = Lease(f"{prefix}/contended", f"t{i}", timeout=30, heartbeat_interval=10, settle=0.2)
        barrier.wait()
        if lease.try_acquire():
            winners.append(lease)

    threads = [threading.Thread(target=contend, args=(i,)) for i in range(threads_n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for lease in winners:
        lease.release()
    assert len(winners) == 1


def test_error_after_claim_leaves_no_orphan_claim(tmp_path, monkeypatch):
    """Bug 10 (b): an exception after the claim was written (here: the first heartbeat
    write) left an orphan claim that blocked the step until its timeout."""
    directory = str(tmp_path / "lease")
    first = Lease(directory, "first", timeout=60, heartbeat_interval=1)

    def broken_beat(released):
        raise OSError("storage hiccup")

    monkeypatch.setattr(first, "_write_beat", broken_beat)
    with pytest.raises(OSError, match="hiccup"):
        first.try_acquire()
    assert first.epoch is None
    second = Lease(directory, "second", timeout=60, heartbeat_interval=1)
    assert second.try_acquire()  # not blocked for 60 s by first's claim
    second.release()


def test_a_step_whose_lease_was_taken_while_its_heartbeat_stalled_does_not_record_success(tmp_path):
    """Review defect: SUCCESS was written when the heartbeat thread had not noticed a takeover
    (`lease.lost` still False), e.g. while it was stuck in a storage call. Here it never looks
    (a 10-minute interval) and a rival claims the next epoch while the step runs."""
    import json

    prefix = str(tmp_path / "out")

    def work(config):
        lease_dir = f"{config.output_path}/.executor_lease"
        claims = sorted(n for n in os.listdir(lease_dir) if n.startswith("claim-"))
        assert claims == ["claim-00000001.json"]  # ours
        rival = {"owner": "rival", "token": "rival-token", "epoch": 2, "heartbeat": time.time(), "since": time.time(),
                 "timeout": 1200, "host": "elsewhere", "pid": 1}
        with open(f"{lease_dir}/claim-00000002.json", "w") as f:
            json.dump(rival, f)

    step = ExecutorStep("taken", work, Cfg(versioned(1), this_output_path()))
    executor = Executor(prefix, poll_interval=0.05, heartbeat_interval=600, lease_timeout=1200)
    output_path = executor.plan([step]).steps[0].output_path
    with pytest.raises(Exception, match="lost its lease"):
        executor.run([step])
    assert read_status(output_path) != StepStatus.SUCCESS
    assert os.path.exists(f"{output_path}/.executor_lease/claim-00000002.json")  # the fault landed
