"""What Linux's /proc says about this machine's processes, and signalling a list of them.

The local cluster stops exactly its own processes (never `ray stop`, which would end every
Ray on the machine): those whose environment carries its tag, and whatever still listens on
its ports. Off Linux (no /proc) every question here answers "none known".
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

__all__ = ["cmdline_contains", "descendants", "find_processes", "has_env_entry", "listeners", "signal_all", "start_time"]

_PROC = Path("/proc")


def find_processes(*, env_entry: bytes | None = None, sessions: Iterable[int] = ()) -> list[int]:
    """Live processes (zombies left out, this one too) whose environment holds `env_entry`
    (a `NAME=value` entry) or, without one, whose session id is in `sessions`."""
    sessions = set(sessions)
    found = []
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if fields[0] == "Z":
                continue
            if env_entry is not None:
                match = env_entry in (entry / "environ").read_bytes().split(b"\0")
            else:
                match = int(fields[3]) in sessions
        except (OSError, IndexError, ValueError):
            continue
        if match:
            found.append(int(entry.name))
    return found


def _stat_fields(pid: int | str) -> list[str] | None:
    """The fields of /proc/PID/stat after the command name (state first), or None if gone."""
    try:
        return (_PROC / str(pid) / "stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def start_time(pid: int) -> int | None:
    """When `pid` started (clock ticks since boot), or None if it is gone: with the pid, it
    names one process, never a later one that reuses the pid."""
    fields = _stat_fields(pid)
    return int(fields[19]) if fields and fields[0] != "Z" else None


def descendants(roots: Iterable[int]) -> list[int]:
    """Live processes whose chain of parents reaches one of `roots` (the roots left out).

    A process that renames itself (Ray's agents do) overwrites the memory /proc shows as its
    environment and command line; its parent still says whose it is, while the parent lives.
    """
    children: dict[int, list[int]] = {}
    for entry in _PROC.iterdir() if _PROC.is_dir() else ():
        if entry.name.isdigit() and (fields := _stat_fields(entry.name)) and fields[0] != "Z":
            children.setdefault(int(fields[1]), []).append(int(entry.name))
    found, todo = [], list(roots)
    seen = set(todo)
    while todo:
        for child in children.get(todo.pop(), ()):
            if child not in seen:
                seen.add(child)
                found.append(child)
                todo.append(child)
    return found


def has_env_entry(pid: int, env_entry: bytes) -> bool:
    """Whether process `pid`'s environment holds `env_entry` (`NAME=value`); False if unreadable."""
    try:
        return env_entry in (_PROC / str(pid) / "environ").read_bytes().split(b"\0")
    except OSError:
        return False


def cmdline_contains(pid: int, text: str) -> bool:
    """Whether process `pid`'s command line contains `text`; False if unreadable."""
    try:
        return text.encode() in (_PROC / str(pid) / "cmdline").read_bytes()
    except OSError:
        return False


def listeners(ports: set[int]) -> dict[int, list[int]]:
    """{port: pids} of processes listening on these local TCP ports."""
    inodes: dict[str, int] = {}
    for table in ("net/tcp", "net/tcp6"):
        try:
            rows = (_PROC / table).read_text().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            port = int(fields[1].rsplit(":", 1)[1], 16)
            if fields[3] == "0A" and port in ports:  # 0A: LISTEN
                inodes[f"socket:[{fields[9]}]"] = port
    held: dict[int, list[int]] = {}
    if not inodes:
        return held
    for entry in _PROC.iterdir():
        if not entry.name.isdigit():
            continue
        try:
            for fd in (entry / "fd").iterdir():
                port = inodes.get(os.readlink(fd))
                if port is not None:
                    held.setdefault(port, []).append(int(entry.name))
        except OSError:
            continue
    return held


def signal_all(pids: Iterable[int], sig: int) -> None:
    """Send `sig` to each of `pids`; those gone already, or not ours to signal, are skipped."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass
