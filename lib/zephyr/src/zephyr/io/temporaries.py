"""Private temporary files and folders that name their owner, and the sweep of dead owners' ones.

A writer killed at any moment (a preempted worker, a SIGKILLed driver) cannot clean up after
itself, so every temporary Zephyr makes carries its owner, `<pid>@<host id>` (the host id
also tells kernel boots and PID namespaces apart: see `HOST_ID`):

- `.NAME.zephyr-tmp-<owner>-<id>` beside a local output (see `zephyr.io.files.atomic_write`);
- `zephyr-upload-<owner>-<id>` in the temp dir: an object-store output staged for upload;
- `zephyr-merge-<owner>-<id>/` in the temp dir: a reduce task's intermediate merge runs;
- `zephyr-segment-<owner>-<id>` in the temp dir: a Parquet writer's rows so far (`zephyr.io.parquet`).

`sweep_dead_temporaries()` removes those of the temp dir whose owner is a dead process on this
host (or, for another host, boot or PID namespace, or an unparsable name, that are over a day
old); a live owner's are never touched, so concurrent runs on one machine are safe. Each
process sweeps once, when it first makes a temporary or starts a run.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import re
import shutil
import socket
import tempfile
import threading
import time
from pathlib import Path

__all__ = [
    "HOST_ID", "host_id", "is_stale", "make_temp_dir", "make_temp_file", "owner_tag", "process_alive",
    "sweep_dead_temporaries",
]


def host_id(hostname: str, boot_id: str = "", pid_namespace: str = "") -> str:
    """A short hex id of a process's pid space: its host name, kernel boot and PID namespace.

    The host name alone is not enough: containers with host networking (`--net=host`,
    hostNetwork pods) share it but not their pids, so a pid running in one is "dead" in another.
    """
    key = hostname if not (boot_id or pid_namespace) else f"{hostname}\0{boot_id}\0{pid_namespace}"
    return hashlib.blake2b(key.encode(), digest_size=4).hexdigest()


def _proc_text(read) -> str:
    """What `read()` gives from /proc, or "" where /proc lacks it (not Linux, a restricted /proc)."""
    try:
        return read().strip()
    except OSError:
        return ""


# Whose pids `process_alive` can judge: only owners with this id (same host name, boot and PID
# namespace); others' temporaries and leases fall back to their age or heartbeat.
HOST_ID = host_id(
    socket.gethostname(),
    _proc_text(lambda: Path("/proc/sys/kernel/random/boot_id").read_text()),
    _proc_text(lambda: os.readlink("/proc/self/ns/pid")),
)
STALE_AFTER = 24 * 3600  # seconds; for temporaries whose owner cannot be checked
_KINDS = ("upload", "merge", "segment")
_OWNED = re.compile(r"(\d+)@([0-9a-f]+)-")
_swept: set[tuple[int, str]] = set()  # (pid, temp dir) already swept by this process
_lock = threading.Lock()


def owner_tag() -> str:
    """`<pid>@<host id>` of the calling process (computed per call: forks change the pid)."""
    return f"{os.getpid()}@{HOST_ID}"


def make_temp_file(kind: str) -> str:
    """A new empty file `zephyr-<kind>-<owner>-<id>` in the temp dir; the caller removes it."""
    sweep_dead_temporaries()
    fd, path = tempfile.mkstemp(prefix=f"zephyr-{kind}-{owner_tag()}-")
    os.close(fd)
    return path


def make_temp_dir(kind: str) -> str:
    """A new folder `zephyr-<kind>-<owner>-<id>` in the temp dir; the caller removes it."""
    sweep_dead_temporaries()
    return tempfile.mkdtemp(prefix=f"zephyr-{kind}-{owner_tag()}-")


def sweep_dead_temporaries(directory: str | None = None, *, force: bool = False) -> int:
    """Remove the temp dir's Zephyr temporaries whose owner is gone; returns how many.

    Runs once per process and directory unless `force`.
    """
    directory = directory or tempfile.gettempdir()
    with _lock:
        key = (os.getpid(), directory)
        if key in _swept and not force:
            return 0
        _swept.add(key)
    removed = 0
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(directory):
            kind = next((k for k in _KINDS if entry.name.startswith(f"zephyr-{k}-")), None)
            if kind is None or not is_stale(entry, entry.name[len(f"zephyr-{kind}-") :]):
                continue
            if entry.is_dir(follow_symlinks=False):
                shutil.rmtree(entry.path, ignore_errors=True)
            else:
                with contextlib.suppress(FileNotFoundError):
                    os.remove(entry.path)
            removed += 1
    return removed


def is_stale(entry: os.DirEntry | Path, suffix: str) -> bool:
    """Whether the temporary `entry`, whose name ends in `suffix` (`<pid>@<host>-<id>`), is
    litter: its owner is a dead process on this host (same boot and PID namespace: `HOST_ID`),
    or it cannot be checked and is old."""
    match = _OWNED.match(suffix)
    if match and match.group(2) == HOST_ID:
        return not process_alive(int(match.group(1)))
    with contextlib.suppress(FileNotFoundError):
        return time.time() - os.stat(entry, follow_symlinks=False).st_mtime > STALE_AFTER
    return False


def process_alive(pid: int) -> bool:
    """Whether `pid` runs on this host (a zombie, dead but not yet reaped, does not count)."""
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
        return state != "Z"
    except FileNotFoundError:
        return False
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
