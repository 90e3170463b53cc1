"""The heartbeat lease (`zephyr.io.lease`) in zephyr's no-history mode: what runs into one
output directory hold. The executor's use (history kept) is tested in lib/marin/tests."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest

from zephyr.io.lease import Lease
from zephyr.io.temporaries import HOST_ID, host_id, process_alive, sweep_dead_temporaries


def lease(directory) -> Lease:
    return Lease(str(directory), timeout=30, heartbeat_interval=5, keep_history=False)


def dead_pid() -> int:
    return int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True).stdout)


def write_claim(directory, epoch: int, pid: int, token: str) -> None:
    directory.mkdir(exist_ok=True)
    claim = {"owner": f"elsewhere:{pid}", "token": token, "epoch": epoch, "heartbeat": time.time(), "since": time.time(),
             "timeout": 30, "host": HOST_ID, "pid": pid}
    (directory / f"claim-{epoch:08d}.json").write_text(json.dumps(claim))


def test_a_released_lease_leaves_no_files(tmp_path):
    held = lease(tmp_path / "l")
    assert held.try_acquire()
    assert not lease(tmp_path / "l").try_acquire()  # held (this process is alive)
    held.release()
    assert list((tmp_path / "l").iterdir()) == []


def test_a_holder_on_this_host_whose_process_died_is_stale_at_once_and_its_files_go(tmp_path):
    directory = tmp_path / "l"
    write_claim(directory, 3, dead_pid(), "a" * 32)  # heartbeat fresh: only its dead pid tells
    (directory / f"beat-00000003-{'a' * 32}.json").write_text(json.dumps({"heartbeat": time.time(), "released": False}))
    taker = lease(directory)
    assert taker.try_acquire() and taker.epoch == 4
    assert sorted(p.name for p in directory.iterdir()) == sorted(["claim-00000004.json", f"beat-00000004-{taker.token}.json"])
    taker.release()
    assert list(directory.iterdir()) == []


class ListsBeforeARival(Lease):
    """A contender whose first listing comes just before another contender's claim of a later
    epoch appears (that one judged a previous holder stale just before it released and
    deleted its files, so epochs restarted at 1 for us)."""

    looked = False

    def _claims(self):
        claims = super()._claims()
        if not self.looked:
            self.looked = True
            write_claim(self.rival_dir, 2, os.getpid(), "b" * 32)  # live: this process
        return claims


def test_two_contenders_on_different_epochs_never_both_hold(tmp_path):
    """Regression for the no-history race: the contender that went for epoch 1 while a rival
    claimed epoch 2 sees the rival's live claim after creating its own, and gives up."""
    directory = tmp_path / "l"
    contender = ListsBeforeARival(str(directory), timeout=30, heartbeat_interval=5, keep_history=False)
    contender.rival_dir = directory
    assert not contender.try_acquire()
    assert sorted(p.name for p in directory.iterdir()) == ["claim-00000002.json"]  # its own claim removed


def _proc(read) -> str:
    try:
        return read().strip()
    except OSError:
        return ""


BOOT_ID = _proc(lambda: Path("/proc/sys/kernel/random/boot_id").read_text())
PID_NAMESPACE = _proc(lambda: os.readlink("/proc/self/ns/pid"))


def test_a_claim_from_another_boot_or_pid_namespace_is_judged_by_its_heartbeat_not_its_pid(tmp_path):
    """Review defect: the host id was the host name alone, so a holder in a container with host
    networking (same host name, own PID namespace) whose pid does not run here was "dead"."""
    hostname = socket.gethostname()
    assert host_id(hostname, BOOT_ID, PID_NAMESPACE) == HOST_ID  # what this process's claims record
    pid = dead_pid()
    for other in (host_id(hostname, "another-boot", PID_NAMESPACE), host_id(hostname, BOOT_ID, "pid:[1]")):
        assert other != HOST_ID
        fresh = {"heartbeat": time.time(), "timeout": 30, "host": other, "pid": pid}
        assert Lease.is_live(fresh)  # its pid means nothing here: its heartbeat decides
        assert not Lease.is_live({**fresh, "heartbeat": time.time() - 60})
    assert not Lease.is_live({"heartbeat": time.time(), "timeout": 30, "host": HOST_ID, "pid": pid})


def test_a_temporary_of_another_pid_namespace_goes_by_age_only(tmp_path):
    """The temp-file sweep shares the host id: another namespace's temporaries (a shared temp
    dir or output folder) are not removed for a pid that is dead here, but still after a day."""
    pid = dead_pid()
    other = host_id(socket.gethostname(), BOOT_ID, "pid:[1]")
    fresh = tmp_path / f"zephyr-upload-{pid}@{other}-fresh"
    old = tmp_path / f"zephyr-upload-{pid}@{other}-old"
    ours_dead = tmp_path / f"zephyr-upload-{pid}@{HOST_ID}-dead"
    for path in (fresh, old, ours_dead):
        path.write_text("x")
    two_days_ago = time.time() - 2 * 24 * 3600
    os.utime(old, (two_days_ago, two_days_ago))
    assert sweep_dead_temporaries(str(tmp_path), force=True) == 2
    assert sorted(p.name for p in tmp_path.iterdir()) == [fresh.name]


# A lease holder in its own PID namespace (as in a --net=host container: same host name). Its pid
# there is one that no process has here, so "same host, pid not running" would call it dead.
NS_HOLDER = textwrap.dedent(
    """
    import json, os, sys, time
    avoid = set(map(int, os.environ["AVOID_PIDS"].split()))
    while True:  # pids restart at 1 in a new namespace: fork until one is unused outside it
        child = os.fork()
        if child == 0:
            if os.getpid() in avoid:
                os._exit(0)
            break
        status = os.waitpid(child, 0)[1]
        if child not in avoid:
            sys.exit(os.waitstatus_to_exitcode(status))
    from zephyr.io.lease import Lease
    from zephyr.io.temporaries import make_temp_file
    lease_dir, ready, stop = sys.argv[1:]
    lease = Lease(lease_dir, timeout=30, heartbeat_interval=1, keep_history=False)
    assert lease.try_acquire()
    temp = make_temp_file("upload")  # in $TMPDIR, shared with the test
    with open(ready + ".part", "w") as f:
        json.dump({"pid": os.getpid(), "temp": temp}, f)
    os.replace(ready + ".part", ready)
    deadline = time.time() + 300
    while not os.path.exists(stop) and time.time() < deadline:
        time.sleep(0.05)
    lease.release()
    os.remove(temp)
    """
)

UNSHARE = ["unshare", "--pid", "--fork", "--kill-child", "--mount-proc"]


def _unshare_unavailable() -> str | None:
    if shutil.which("unshare") is None:
        return "no unshare binary"
    probe = subprocess.run([*UNSHARE, "true"], capture_output=True, text=True)
    if probe.returncode != 0:
        return f"`unshare --pid --fork --mount-proc` not permitted here: {probe.stderr.strip()}"
    return None


def test_a_live_holder_in_another_pid_namespace_on_this_host_keeps_its_lease(tmp_path):
    """Review defect (lease_pid_namespace.sh): an executor in a container with host networking
    took over a live holder's lease because the holder's pid was not running in its namespace."""
    reason = _unshare_unavailable()
    if reason:
        pytest.skip(reason)
    (tmp_path / "tmp").mkdir()
    ready, stop = tmp_path / "ready.json", tmp_path / "stop"
    script = tmp_path / "ns_holder.py"
    script.write_text(NS_HOLDER)
    avoid = " ".join(name for name in os.listdir("/proc") if name.isdigit())
    env = dict(os.environ, AVOID_PIDS=avoid, TMPDIR=str(tmp_path / "tmp"))
    holder = subprocess.Popen([*UNSHARE, sys.executable, str(script), str(tmp_path / "l"), str(ready), str(stop)],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not ready.exists():
            assert holder.poll() is None, holder.communicate()[0]
            assert time.monotonic() < deadline, "the holder did not take the lease within 120 s"
            time.sleep(0.05)
        info = json.loads(ready.read_text())
        record = lease(tmp_path / "l").current()
        assert record["pid"] == info["pid"]
        assert not process_alive(info["pid"])  # its pid means nothing here (what the old code trusted)
        assert Lease.is_live(record)
        contender = lease(tmp_path / "l")
        assert not contender.try_acquire(), "took over a live holder's lease"
        assert sweep_dead_temporaries(str(tmp_path / "tmp"), force=True) == 0
        assert os.path.exists(info["temp"])  # a live writer's temporary stays
        stop.touch()
        assert holder.wait(timeout=120) == 0, holder.communicate()[0]
        assert contender.try_acquire()  # released: free at once
        contender.release()
    finally:
        stop.touch()
        if holder.poll() is None:
            try:
                holder.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(holder.pid, signal.SIGKILL)  # unshare and the namespace's init: all of it dies
                holder.wait()


def test_release_does_not_hang_on_a_heartbeat_stuck_in_storage(tmp_path):
    """A heartbeat whose storage call never returns made `release()` (and so the run) hang."""
    directory = tmp_path / "l"
    held = Lease(str(directory), timeout=1, heartbeat_interval=0.05, keep_history=False)
    stuck, unstick = threading.Event(), threading.Event()
    real_write_beat = held._write_beat

    def write_beat(released, outcome=None, error=None):
        if threading.current_thread().name.startswith("lease-heartbeat"):
            stuck.set()
            unstick.wait(600)
        return real_write_beat(released, outcome, error)

    held._write_beat = write_beat
    try:
        assert held.try_acquire()
        assert stuck.wait(60)
        releaser = threading.Thread(target=held.release, daemon=True)
        releaser.start()
        releaser.join(60)  # the bound is the lease's 1 s timeout; generous for a loaded machine
        assert not releaser.is_alive(), "release() waited for the stuck heartbeat"
        successor = lease(directory)
        assert successor.try_acquire()  # released: free at once
        successor.release()
    finally:
        unstick.set()
