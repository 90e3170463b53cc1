"""One run at a time per output: leases on a run's final output directory and its shared scratch.

Two runs into one directory would delete each other's in-progress temporaries and scratch
when the first one finishes. So a run holds a lease (`zephyr.io.lease`, heartbeating) on its
final output directory, in `<dir>/.zephyr-lease/`, for its whole length; a second run into
that directory fails at once with `OutputBusyError`, naming the holder. A holder on this host
whose process is dead is stale at once (a rerun after a killed run goes ahead); a holder on
another host that stopped heartbeating is taken over after `LEASE_TIMEOUT` seconds.

Scratch beside the output (the default `<dir>/.zephyr-scratch`) is covered by that lease.
Scratch elsewhere (an explicit `scratch_dir`, or the temp dir when there is no output) is
keyed by the stage fingerprint only, so two runs of one pipeline into different outputs
share `<scratch>/<fingerprint>`: each such root gets its own lease (`<scratch>/.<fingerprint>
.zephyr-lease/`), and a second run waits for it (they serialize: the second then finds its
map output ready, or recomputes it), rather than failing, since its output is its own.
Leases are taken in sorted order, so two runs never wait for each other in a circle.
A finished run, successful or not, removes its lease files.
"""

from __future__ import annotations

import logging
import time

from zephyr.io.files import remove_empty_dir, remove_tree, url_to_fs
from zephyr.io.lease import Lease

__all__ = ["LEASE_TIMEOUT", "OutputBusyError", "RunLocks", "release_dead_scratch_lease"]

logger = logging.getLogger("zephyr")

LEASE_TIMEOUT = 60.0  # seconds without a heartbeat after which another host's holder is stale
_HEARTBEAT = 10.0
_POLL = 0.25  # seconds between looks at a busy scratch lease
_LOOKS = 3  # a claim that vanished between listing and reading: its holder just released


class OutputBusyError(RuntimeError):
    """Another run is writing into the same output directory."""


class RunLocks:
    """The leases of one run: its output directory (fail fast) and shared scratch roots (wait)."""

    def __init__(self, output_dir: str | None, scratch_roots: list[str]):
        self.output = _lease(f"{output_dir}/.zephyr-lease") if output_dir is not None else None
        self.scratch = [_lease(_scratch_lease_dir(root)) for root in sorted(set(scratch_roots))]
        self.held: list[Lease] = []

    def acquire(self) -> None:
        """Take every lease, or raise OutputBusyError (releasing what was taken)."""
        try:
            if self.output is not None:
                self._take_output(self.output)
            for lease in self.scratch:
                self._wait_for(lease)
        except BaseException:
            self.release()
            raise

    def release(self) -> None:
        """Give every held lease back and remove its files (nothing is left behind)."""
        while self.held:
            lease = self.held.pop()
            try:
                lease.release()
                remove_empty_dir(lease.directory)
            except Exception as e:  # noqa: BLE001 - a stale lease expires; the run's result stands
                logger.warning("zephyr: could not release the lease %s: %s: %s", lease.directory, type(e).__name__, e)

    def _take_output(self, lease: Lease) -> None:
        for _ in range(_LOOKS):
            if lease.try_acquire():
                self.held.append(lease)
                return
            holder = lease.current()
            if holder is not None and Lease.is_live(holder):
                raise OutputBusyError(_busy_message(lease.directory.rsplit("/", 1)[0], holder))
        raise OutputBusyError(f"another zephyr run is already running into {lease.directory.rsplit('/', 1)[0]} "
                              f"(its lease {lease.directory} changed hands while this run looked); try again")

    def _wait_for(self, lease: Lease) -> None:
        said = False
        while not lease.try_acquire():
            holder = lease.current()
            if holder is not None and Lease.is_live(holder) and not said:
                logger.warning("zephyr: waiting for the run %s, which uses the same scratch (%s), to finish",
                               holder.get("owner"), lease.directory)
                said = True
            time.sleep(_POLL)
        self.held.append(lease)


def _lease(directory: str) -> Lease:
    return Lease(directory, timeout=LEASE_TIMEOUT, heartbeat_interval=_HEARTBEAT, keep_history=False)


def release_dead_scratch_lease(root: str) -> bool:
    """Before a scratch root is removed: False when a live run holds its lease (it is using the
    root: leave it); else remove the dead holder's lease files, if any, and return True."""
    lease = _lease(_scratch_lease_dir(root))
    holder = lease.current()
    if holder is not None and Lease.is_live(holder):
        return False
    fs, path = url_to_fs(lease.directory)
    if fs.exists(path):
        remove_tree(lease.directory)
    return True


def _scratch_lease_dir(root: str) -> str:
    parent, _, name = root.rstrip("/").rpartition("/")
    return f"{parent}/.{name}.zephyr-lease"


def _busy_message(directory: str, holder: dict) -> str:
    since = time.strftime("%Y-%m-%d %H:%M:%S UTC", time.gmtime(float(holder.get("since", holder["heartbeat"]))))
    beat = time.time() - float(holder["heartbeat"])
    return (
        f"another zephyr run is already running into {directory}: {holder.get('owner')} since {since} "
        f"(last heartbeat {beat:.0f}s ago). Two runs into one directory would delete each other's work: wait "
        f"for it to finish, or write elsewhere. A run that died on this machine frees it at once; one on another "
        f"machine after {LEASE_TIMEOUT:.0f}s without a heartbeat."
    )
