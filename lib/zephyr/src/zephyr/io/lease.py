"""A heartbeat lease on a directory, so that executors sharing a prefix run a step once, and
zephyr runs into one output directory never overlap (`zephyr.execution.run_lock`).

The lease is a sequence of *epochs*. Each epoch has one owner, recorded in an immutable
claim file, and the owner keeps a heartbeat file fresh while it holds the lease:

    claim-00000001.json                 local disk: one claim per epoch (exclusive create)
    claim-00000001-<token>.json         object stores: one claim per contender
    beat-00000001-<token>.json          the owner's heartbeat: {heartbeat, released}

- **Acquire.** Find the newest epoch E and its owner. If the owner is live (not released,
  heartbeat younger than the `timeout` it promised) give up for now. Otherwise contend for
  epoch E+1 (E+1 = 1 when nothing exists):
  - *local disk*: hard-link a complete temporary file to `claim-<E+1>.json`; the link fails
    if the name exists, so exactly one contender wins.
  - *object stores*: write our own `claim-<E+1>-<token>.json` (no overwrites, so no
    precondition support needed), wait `settle` seconds, list the claims of E+1: the owner is
    the claim with the smallest creation order (GCS: the generation the server assigns when
    an upload completes; ties by name). Why only one contender believes it won: if A's claim
    has a smaller generation than B's, A's upload finished before B's did, so B's listing
    (after B's upload) sees A's claim and B loses; A may or may not see B, and wins either
    way. Losers delete their claims. The settle delay only covers two uploads finishing in
    the same instant and a store whose listing lags its generation counter (the emulator).
- **Heartbeat.** While held, a thread rewrites our beat file every `heartbeat_interval`
  seconds, and first checks that no claim of a newer epoch exists; if one does (we stalled
  past our timeout and were taken over) the lease is marked `lost`. The thread may itself be
  the one stalled (a storage call that hangs), so before acting on the lease (the executor
  writing SUCCESS) the holder asks `still_held()`, which lists the claims there and then.
- **Release.** Write the beat file with `released: true` and the step's outcome and error
  (the status file holds only the status token); the next acquirer claims E+1. Release waits
  at most `timeout` for a heartbeat thread stuck in a storage call.
  An error after our claim was written but before the lease is held (the read-back, the
  first heartbeat) removes the claim again (or, failing that, marks it released), so no
  orphan claim blocks the step until its timeout.

- **Same-host liveness.** A claim records the holder's host and pid: a holder on this host
  whose process is dead (or a zombie) is stale at once, so a rerun right after a killed run
  is not blocked for `timeout`. "This host" means the same host name, kernel boot and PID
  namespace (`zephyr.io.temporaries.HOST_ID`): containers with host networking share the
  host name but not their pids. Holders anywhere else are judged by their heartbeat alone.
- **No history (`keep_history=False`, zephyr's runs).** Release deletes our claim, then our
  beat file, instead of writing a released beat; whoever takes over a stale epoch deletes the
  older epochs' files once it holds the lease. So a finished run leaves nothing. The race
  this opens: epochs restart at 1 once the directory is empty, so a contender that judged
  our epoch E stale just before we deleted it goes for E+1 while one that lists after the
  deletion goes for 1, and both exclusive creates succeed. So in this mode a winner lists
  the claims once more after creating its own and gives up (removing it) if any claim of
  another epoch is live. Of two such contenders, the one that looks second sees the
  other's claim, so at most one holds; both may give up (the caller may look again). A
  contender that listed our claim but finds it gone when reading it also gives up.

Staleness compares the holder's wall clock (written in its files) with the reader's, so
machines must agree to well within `timeout`. A holder that freezes longer than its timeout
without dying can overlap with its successor: the price of any lease, so keep `timeout`
several heartbeats long. Files are never deleted except losing claims, so the directory is
also the history of who ran the step.
"""

from __future__ import annotations

import json
import logging
import os
import re
import threading
import time
import uuid
from typing import Any

from zephyr.io import storage
from zephyr.io.temporaries import HOST_ID, process_alive
import socket

__all__ = ["Lease", "default_owner"]

logger = logging.getLogger(__name__)

_CLAIM = re.compile(r"^claim-(\d{8})(?:-([0-9a-f]{32}))?\.json$")


def default_owner() -> str:
    """A readable identity for this process: host and pid."""
    return f"{socket.gethostname()}:{os.getpid()}"


class Lease:
    """A lease on `directory`; see the module docstring for the protocol.

    Args:
        directory: where the claim and beat files live (local path or URL).
        owner: a readable name of the holder, recorded in its claim.
        timeout: seconds after the last heartbeat at which others may take the lease over.
        heartbeat_interval: seconds between heartbeats; must be well below `timeout`.
        settle: seconds to wait before reading the claims back on object stores.
        keep_history: keep every epoch's files (the executor's record of who ran a step);
            False deletes ours on release and older ones on takeover (see the module docstring).
    """

    def __init__(
        self,
        directory: str,
        owner: str | None = None,
        *,
        timeout: float = 60.0,
        heartbeat_interval: float = 10.0,
        settle: float = 1.0,
        keep_history: bool = True,
    ) -> None:
        if heartbeat_interval <= 0 or timeout <= heartbeat_interval:
            raise ValueError(
                f"lease timeout must exceed heartbeat_interval > 0; got timeout={timeout}, heartbeat_interval={heartbeat_interval}"
            )
        self.directory = directory.rstrip("/")
        self.owner = owner or default_owner()
        self.timeout = timeout
        self.heartbeat_interval = heartbeat_interval
        self.settle = settle
        self.keep_history = keep_history
        self.token = uuid.uuid4().hex
        self.epoch: int | None = None
        self.lost = False
        self._local = storage.creates_exclusively(storage.filesystem(self.directory)[0])
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- reading -------------------------------------------------------------------------

    def _claims(self) -> dict[int, list[str]]:
        """Claim file names per epoch, owner first (smallest creation order, then name)."""
        by_epoch: dict[int, list[tuple[float, str]]] = {}
        for name, order in storage.list_ordered(self.directory):
            match = _CLAIM.match(name)
            if match:
                by_epoch.setdefault(int(match.group(1)), []).append((order, name))
        return {epoch: [name for _, name in sorted(claims)] for epoch, claims in by_epoch.items()}

    def _owner_record(self, epoch: int, claim_name: str) -> dict[str, Any] | None:
        claim = storage.read_json(f"{self.directory}/{claim_name}")
        if claim is None:
            return None
        beat = storage.read_json(f"{self.directory}/{self._beat_name(epoch, claim['token'])}") or {}
        return {
            **claim,
            "heartbeat": max(claim["heartbeat"], beat.get("heartbeat", 0.0)),
            "released": beat.get("released", False),
            "outcome": beat.get("outcome"),
            "error": beat.get("error"),
        }

    def current(self) -> dict[str, Any] | None:
        """The newest epoch's owner: `{owner, token, epoch, heartbeat, timeout, released,
        outcome, error}`, or None."""
        claims = self._claims()
        if not claims:
            return None
        latest = max(claims)
        return self._owner_record(latest, claims[latest][0])

    def latest_epoch(self) -> int:
        """The newest epoch anyone claimed (0 when none)."""
        return max(self._claims(), default=0)

    def record(self, epoch: int) -> dict[str, Any] | None:
        """The owner record of `epoch` (as `current` gives it), or None when it has none."""
        claims = self._claims().get(epoch)
        return self._owner_record(epoch, claims[0]) if claims else None

    def records_since(self, epoch: int) -> list[dict[str, Any]]:
        """The owner records of `epoch` and every newer epoch, oldest first (one listing)."""
        claims = self._claims()
        records = (self._owner_record(e, claims[e][0]) for e in sorted(claims) if e >= epoch)
        return [r for r in records if r is not None]

    @staticmethod
    def is_live(record: dict[str, Any] | None, now: float | None = None) -> bool:
        """True when `record` (from `current`) is held: not released, heartbeating within its timeout."""
        if not record or record.get("released"):
            return False
        if record.get("host") == HOST_ID and record.get("pid") and not process_alive(int(record["pid"])):
            return False  # its process (same host, boot, pid namespace) is gone: no heartbeat will come
        now = time.time() if now is None else now
        return now - float(record["heartbeat"]) <= float(record["timeout"])

    # -- acquiring -----------------------------------------------------------------------

    def _claim_name(self, epoch: int) -> str:
        return f"claim-{epoch:08d}.json" if self._local else f"claim-{epoch:08d}-{self.token}.json"

    @staticmethod
    def _beat_name(epoch: int, token: str) -> str:
        return f"beat-{epoch:08d}-{token}.json"

    def try_acquire(self) -> bool:
        """Take the lease if it is free, released or stale; never blocks on a live holder."""
        if self.epoch is not None:
            raise RuntimeError(f"lease {self.directory} is already held by this object (epoch {self.epoch})")
        claims = self._claims()
        latest = max(claims, default=0)
        if latest:
            record = self._owner_record(latest, claims[latest][0])
            if record is None or self.is_live(record):
                return False
            if not record.get("released"):
                logger.warning("Taking over stale lease %s from %s (epoch %d)", self.directory, record.get("owner"), latest)
        target = latest + 1
        name = self._claim_name(target)
        claim = json.dumps(
            {
                "owner": self.owner,
                "token": self.token,
                "epoch": target,
                "heartbeat": time.time(),
                "since": time.time(),
                "timeout": self.timeout,
                "host": HOST_ID,
                "pid": os.getpid(),
            }
        )
        if self._local:
            if not storage.create_exclusive(f"{self.directory}/{name}", claim):
                return False
        else:
            storage.write_text(f"{self.directory}/{name}", claim)
            try:
                time.sleep(self.settle)
                won = self._claims().get(target, [None])[0] == name
            except BaseException:
                self.epoch = target
                self._abandon(name)
                raise
            if not won:
                storage.remove(f"{self.directory}/{name}")
                return False
        if not self.keep_history and self._rival_holds(target, name):
            self.epoch = target
            self._abandon(name)
            return False
        self.epoch = target
        self.lost = False
        try:
            self._write_beat(released=False)
            self._stop.clear()
            self._thread = threading.Thread(target=self._beat, name=f"lease-heartbeat:{self.directory}", daemon=True)
            self._thread.start()
        except BaseException:
            self._abandon(name)
            raise
        if not self.keep_history:
            self._remove_epochs_before(target, claims)
        return True

    def _rival_holds(self, epoch: int, name: str) -> bool:
        """Whether a live claim of another epoch exists besides ours (`keep_history=False`)."""
        for other, names in self._claims().items():
            if other != epoch and self.is_live(self._owner_record(other, names[0])):
                return True
        return False

    def _remove_epochs_before(self, epoch: int, claims: dict[int, list[str]]) -> None:
        """Delete the files of epochs older than ours (a dead holder's), once we hold the lease."""
        for old, names in claims.items():
            if old < epoch:
                for name in names:
                    token = (storage.read_json(f"{self.directory}/{name}") or {}).get("token")
                    storage.remove(f"{self.directory}/{name}")
                    if token:
                        storage.remove(f"{self.directory}/{self._beat_name(old, token)}")

    def _abandon(self, claim_name: str) -> None:
        """Undo a claim we cannot hold (an error after it was written): remove it, else mark it released."""
        self.epoch, epoch = None, self.epoch
        try:
            storage.remove(f"{self.directory}/{claim_name}")
        except Exception:  # noqa: BLE001 - fall back to a released beat
            logger.exception("Could not remove claim %s/%s; marking it released", self.directory, claim_name)
            try:
                storage.write_text(
                    f"{self.directory}/{self._beat_name(epoch, self.token)}",
                    json.dumps({"heartbeat": time.time(), "released": True}),
                )
            except Exception:  # noqa: BLE001
                logger.exception("Could not release claim %s/%s either", self.directory, claim_name)

    def _write_beat(self, released: bool, outcome: str | None = None, error: str | None = None) -> None:
        assert self.epoch is not None
        record: dict[str, Any] = {"heartbeat": time.time(), "released": released}
        if outcome is not None:
            record.update(outcome=outcome, error=error)
        beat = json.dumps(record)
        storage.write_text(f"{self.directory}/{self._beat_name(self.epoch, self.token)}", beat)

    def _taken_over(self) -> bool:
        return max(self._claims(), default=0) > (self.epoch or 0)

    def still_held(self) -> bool:
        """Whether we hold the lease now, read from storage rather than from the heartbeat
        thread (which may be stalled and not have noticed a takeover): our claim still owns
        the newest epoch. Marks the lease `lost` when not."""
        if self.epoch is None or self.lost:
            return False
        claims = self._claims()
        owner = claims.get(self.epoch, [None])[0]
        # by token, not name: without history a successor may reuse our epoch's name once it is gone
        if max(claims, default=0) > self.epoch or owner is None or (
            storage.read_json(f"{self.directory}/{owner}") or {}
        ).get("token") != self.token:
            self.lost = True
            logger.error("Lost lease %s (epoch %s): another executor took it over", self.directory, self.epoch)
        return not self.lost

    def _beat(self) -> None:
        while not self._stop.wait(self.heartbeat_interval):
            try:
                if self._taken_over():
                    self.lost = True
                    logger.error("Lost lease %s (epoch %s): another executor took it over", self.directory, self.epoch)
                    return
                self._write_beat(released=False)
            except Exception:  # a transient storage error must not end the heartbeat
                logger.exception("Heartbeat on lease %s failed; retrying", self.directory)

    def release(self, outcome: str | None = None, error: str | None = None) -> None:
        """Stop heartbeating and mark our epoch released, with the step's `outcome` (a
        status token) and `error` text if given (nothing when not held)."""
        if self.epoch is None:
            return
        self._stop.set()
        if self._thread is not None:
            # bounded: a storage call that hangs in the heartbeat must not hang the release too (if
            # it lands later, our epoch looks live again until its heartbeat is `timeout` old)
            self._thread.join(self.timeout)
            if self._thread.is_alive():
                logger.warning("Heartbeat of lease %s still stuck after %.0fs; releasing without it",
                               self.directory, self.timeout)
        if self.keep_history:
            if not self.lost and not self._taken_over():
                self._write_beat(released=True, outcome=outcome, error=error)
        else:  # the claim first: from then on a contender finds the lease free
            claim = f"{self.directory}/{self._claim_name(self.epoch)}"
            if (storage.read_json(claim) or {}).get("token") == self.token:  # not a successor's
                storage.remove(claim)
            storage.remove(f"{self.directory}/{self._beat_name(self.epoch, self.token)}")
        self.epoch = None
        self._thread = None
