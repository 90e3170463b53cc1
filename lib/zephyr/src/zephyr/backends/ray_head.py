"""Zephyr's reusable local Ray: one head per interpreter, left running between runs.

Starting Ray takes 10-17 s; a user iterating on a laptop paid it on every `zephyr --backend=ray`
run with an embedded Ray. Instead the first run starts a head that outlives it (a supervisor
process, `zephyr.backends.ray_head_serve`, runs `ray start --head --block` in a session of its
own) and later runs connect to it. Its files live in `head_dir()` (`$ZEPHYR_RAY_DIR`, default
`~/.zephyr/ray`, one folder per interpreter and Ray version, since the head's workers run the
interpreter that started it):

- `state.json`: where the head is (GCS address, temp dir), who runs it (the supervisor's pid and
  start time) and for whom (interpreter, Ray version); written once the head is up, removed when
  it stops;
- `auth_token`: the head's own token (mode 600; the head runs with `RAY_AUTH_MODE=token`, so
  no other user of the machine can run code through it);
- `leases/<pid>-<start time>`: one per run connected now; `last_used`: touched when a run ends.
  The supervisor stops the head once no live run holds a lease and the idle time
  (`$ZEPHYR_RAY_IDLE_MINUTES` when the head started, default 30 minutes) passed since the last
  one ended;
- `start.lock`: held while a run starts a head, so two runs starting at once share one;
- `supervisor.log`, `head.log`: what the supervisor and `ray start` said.

`stop_head()` (`zephyr ray stop`) asks the supervisor to stop (SIGTERM) and makes sure that no
process of its session is left.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from zephyr.io.temporaries import process_alive

__all__ = ["DEFAULT_IDLE_MINUTES", "HeadState", "Lease", "LocalRayError", "age_text", "base_dir", "forget_state", "head_dir", "head_dirs",
           "idle_seconds", "kill_session", "leases", "read_state", "running_head", "session_processes", "start_head", "start_time",
           "stop_head", "write_state"]

DIR_ENV = "ZEPHYR_RAY_DIR"
IDLE_ENV = "ZEPHYR_RAY_IDLE_MINUTES"
DEFAULT_IDLE_MINUTES = 30.0
START_TIMEOUT = 900.0  # seconds for the supervisor to report the head up (its attempts included)
STOP_TIMEOUT = 60.0


class LocalRayError(RuntimeError):
    """Zephyr's local Ray could not be started (the message names its log)."""


@dataclass(frozen=True)
class HeadState:
    """What `state.json` records about a running head."""

    gcs_address: str
    supervisor_pid: int
    supervisor_started: int  # /proc start time of the supervisor: a reused pid is never taken for it
    temp_dir: str
    session_dir: str
    python: str
    ray_version: str
    token_path: str
    idle_s: float
    started_at: float
    num_cpus: int

    @property
    def alive(self) -> bool:
        return process_alive(self.supervisor_pid) and start_time(self.supervisor_pid) == self.supervisor_started


def base_dir() -> Path:
    """`$ZEPHYR_RAY_DIR`, default `~/.zephyr/ray`: every interpreter's head folder is in it."""
    return Path(os.environ.get(DIR_ENV) or Path.home() / ".zephyr" / "ray")


def head_dir(base: Path | None = None) -> Path:
    """This interpreter's (and Ray version's) folder under `base` (default `base_dir()`)."""
    import ray

    key = hashlib.sha256(f"{sys.executable}\0{ray.__version__}".encode()).hexdigest()[:12]
    return (base or base_dir()) / key


def head_dirs() -> list[Path]:
    """Every head folder under `base_dir()` (other interpreters' too), whether a head runs there or not."""
    base = base_dir()
    return sorted(p for p in base.iterdir() if p.is_dir()) if base.is_dir() else []


def idle_seconds() -> float:
    """How long a head waits unused before it stops (`$ZEPHYR_RAY_IDLE_MINUTES`)."""
    text = os.environ.get(IDLE_ENV, "")
    try:
        minutes = float(text) if text else DEFAULT_IDLE_MINUTES
    except ValueError:
        raise ValueError(f"{IDLE_ENV} must be a number of minutes, got {text!r}") from None
    if not minutes > 0:
        raise ValueError(f"{IDLE_ENV} must be a positive number of minutes, got {text!r}")
    return minutes * 60


def age_text(since: float) -> str:
    """How long ago epoch second `since` was, in seconds or minutes."""
    seconds = max(0.0, time.time() - since)
    return f"{seconds / 60:.0f} min" if seconds >= 60 else f"{seconds:.0f} s"


def start_time(pid: int) -> int | None:
    """The process's start time in clock ticks since boot (/proc/PID/stat), or None if gone."""
    try:
        return int(Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[19])
    except (OSError, IndexError, ValueError):
        return None


def read_state(directory: Path) -> HeadState | None:
    try:
        return HeadState(**json.loads((directory / "state.json").read_text()))
    except (OSError, ValueError, TypeError):
        return None


def write_state(directory: Path, state: HeadState) -> None:
    """`state.json`, atomically: a reader sees the whole record or none."""
    temporary = directory / f".state.json.{os.getpid()}"
    temporary.write_text(json.dumps(asdict(state), indent=1))
    os.replace(temporary, directory / "state.json")


def forget_state(directory: Path, state: HeadState) -> None:
    """Remove `state.json` if it still records `state`'s supervisor (a newer head's stays)."""
    current = read_state(directory)
    if current is not None and (current.supervisor_pid, current.supervisor_started) == (state.supervisor_pid,
                                                                                        state.supervisor_started):
        with contextlib.suppress(FileNotFoundError):
            (directory / "state.json").unlink()


def running_head(directory: Path | None = None) -> HeadState | None:
    """The head recorded in `directory` if its supervisor still runs; a record whose supervisor
    is gone (killed with SIGKILL, the machine rebooted) is removed, with what it left."""
    directory = directory or head_dir()
    state = read_state(directory)
    if state is None or state.alive:
        return state
    _clean_after(directory, state)
    return None


def _clean_after(directory: Path, state: HeadState) -> None:
    kill_session(state.supervisor_pid, state.supervisor_started)
    forget_state(directory, state)
    shutil.rmtree(state.temp_dir, ignore_errors=True)


def start_head(directory: Path | None = None, num_cpus: int | None = None, timeout: float = START_TIMEOUT) -> HeadState:
    """The running head, started now unless one runs (or another run starts one meanwhile).

    Raises LocalRayError with the supervisor's last log lines if it could not start one."""
    directory = directory or head_dir()
    directory.mkdir(parents=True, exist_ok=True)
    with open(directory / "start.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # released if this process dies
        state = running_head(directory)
        if state is not None:
            return state
        log = directory / "supervisor.log"
        argv = [sys.executable, "-m", "zephyr.backends.ray_head_serve", str(directory), str(idle_seconds()), str(num_cpus or 0)]
        env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
        with open(log, "w") as out:
            supervisor = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=out, stderr=subprocess.STDOUT,
                                          start_new_session=True, cwd=directory, env=env)
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and supervisor.poll() is None:
            state = read_state(directory)
            if state is not None and state.supervisor_pid == supervisor.pid:
                return state
            time.sleep(0.2)
        why = f"its supervisor exited with {supervisor.returncode}" if supervisor.poll() is not None else (
            f"it was not up after {timeout:.0f} s")
        if supervisor.poll() is None:
            supervisor.send_signal(signal.SIGTERM)  # it stops what it started
        tail = "\n".join(log.read_text(errors="replace").splitlines()[-8:]) if log.exists() else ""
        raise LocalRayError(f"could not start a local Ray for reuse: {why} (logs: {log}, {directory / 'head.log'}); "
                            f"--local-ray=embedded runs on a Ray of the run's own. The supervisor said:\n{tail}")


def stop_head(directory: Path | None = None, timeout: float = STOP_TIMEOUT) -> HeadState | None:
    """Stop the running head (None if none is recorded): SIGTERM to its supervisor, which stops
    Ray and removes its files; what is left of its session after `timeout` seconds is killed."""
    directory = directory or head_dir()
    state = read_state(directory)
    if state is None:
        return None
    if state.alive:
        os.kill(state.supervisor_pid, signal.SIGTERM)
        os.kill(state.supervisor_pid, signal.SIGCONT)  # a stopped (Ctrl-Z, SIGSTOP) supervisor handles it too
        deadline = time.monotonic() + timeout
        while state.alive and time.monotonic() < deadline:
            time.sleep(0.1)
    _clean_after(directory, state)
    return state


def session_processes(session: int, since: int) -> list[int]:
    """Live processes of session `session` (every Ray process of the head stays in its
    supervisor's session) that started at or after `since` (/proc ticks): a pid reused by an
    unrelated process is not taken for one. This process is never among them."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
            if int(fields[3]) == session and int(fields[19]) >= since and fields[0] != "Z":
                found.append(int(entry.name))
        except (OSError, IndexError, ValueError):
            continue
    return found


def kill_session(session: int, since: int) -> None:
    for pid in session_processes(session, since):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def leases(directory: Path) -> tuple[list[Path], list[Path]]:
    """The lease files in `directory`: those of runs alive now, and those whose run is gone."""
    live, dead = [], []
    for lease in (directory / "leases").glob("*-*"):
        pid, _, started = lease.name.partition("-")
        alive = pid.isdigit() and process_alive(int(pid)) and str(start_time(int(pid))) == started
        (live if alive else dead).append(lease)
    return live, dead


class Lease:
    """A run's claim on the head while it uses it: the supervisor does not stop a head with a
    live lease. Taken before the run reads `state.json` (see `zephyr.backends.ray_head_serve`)."""

    def __init__(self, directory: Path | None = None):
        self.directory = directory or head_dir()
        leases = self.directory / "leases"
        leases.mkdir(parents=True, exist_ok=True)
        self.path = leases / f"{os.getpid()}-{start_time(os.getpid())}"
        self.path.touch()

    def release(self) -> None:
        (self.directory / "last_used").touch()
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
