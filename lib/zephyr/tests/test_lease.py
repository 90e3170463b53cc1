"""The heartbeat lease (`zephyr.io.lease`) in zephyr's no-history mode: what runs into one
output directory hold. The executor's use (history kept) is tested in lib/marin/tests."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

from zephyr.io.lease import Lease
from zephyr.io.temporaries import HOST_ID


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
