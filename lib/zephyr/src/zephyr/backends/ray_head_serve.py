"""The supervisor of zephyr's reusable local Ray (`zephyr.backends.ray_head`):

    python -m zephyr.backends.ray_head_serve DIR IDLE_SECONDS NUM_CPUS

Started detached by the run that found no head; leads a session of its own. It runs
`ray start --head --block` as its child, with this interpreter, every port chosen free (never
Ray's defaults, which another Ray on the machine may hold: Ray's API server takes 8265 even with
the dashboard off), a short temp dir of its own (Ray's socket paths are limited to ~100
characters; `ray start` writes its address file there, not in `/tmp/ray`, so a plain `ray.init()`
never finds this head), no Ray dashboard (zephyr's own `--dashboard` serves the run's page), no
autoscaler, and token authentication with a token of its own. Its environment is a small one (`head_env`): the
head outlives the run that started it, so it carries none of that run's variables; each run
gives its workers its own environment (`zephyr.backends.ray_reuse`).

On a loaded machine a raylet gives up when its dashboard agent has not written its port within
~15 s (hard-coded in Ray), and `ray start` notices only ~90 s later: an attempt whose raylet
says so is ended at once and started again on fresh ports, 3 attempts in all. Once the head is up
it writes `state.json`.

Then it watches, every second: when the node dies (its `ray start`, GCS server or raylet exits,
e.g. after a `ray stop`), on SIGTERM (`zephyr ray stop`), or when no run has held a lease for the
idle time, it stops. An idle stop first takes `state.json` away (a run that read it before holds
a lease by then: the lease is taken first, so the supervisor sees it and stays). Stopping ends
`ray start` (which stops its node), kills whatever of the session is left, removes the temp dir
and exits.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from importlib.metadata import version  # not `import ray`: this process stays small (it lives as long as the head)
from pathlib import Path

from zephyr.backends.ray_head import HeadState, forget_state, kill_session, leases, session_processes, start_time, write_state
from zephyr.backends.ray_local import free_port

ATTEMPTS = 3
UP_TIMEOUT = 240.0  # seconds for one `ray start` to report the node up
_PORTS = ("port", "ray-client-server-port", "node-manager-port", "object-manager-port", "dashboard-port",
          "dashboard-agent-listen-port", "dashboard-agent-grpc-port", "runtime-env-agent-port", "metrics-export-port")
# Ray's startup deadlines lengthened for a loaded machine, and no 30 s drain when stopped (the
# user's own settings win)
_RAY_DEFAULTS = {"RAY_raylet_start_wait_time_s": "60", "RAY_worker_register_timeout_seconds": "300",
                 "RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S": "0", "RAY_USAGE_STATS_ENABLED": "0"}
# what the head's own processes keep of the environment that started it (and every RAY_ setting)
_KEPT = ("PATH", "HOME", "USER", "LOGNAME", "SHELL", "LANG", "TZ", "TMPDIR", "VIRTUAL_ENV")
_RAYLET_GAVE_UP = ("Timed out waiting for file", "Check failed")
_NODE = ("gcs_server", "raylet")  # the processes without which the head is gone


class _Stop(Exception):
    """SIGTERM: stop the head."""


def _raise_stop(signum, frame):
    raise _Stop()


def head_env(token: Path) -> dict[str, str]:
    """The head's environment: a small one (see the module docstring), the head's own token, and
    nothing of another Ray."""
    env = {k: v for k, v in os.environ.items()
           if k in _KEPT or k.startswith("LC_") or (k.startswith("RAY_") and k not in ("RAY_ADDRESS", "RAY_AUTH_TOKEN"))}
    env.update(RAY_AUTH_MODE="token", RAY_AUTH_TOKEN_PATH=str(token))
    for key, value in _RAY_DEFAULTS.items():
        env.setdefault(key, value)
    return env


def ensure_token(directory: Path) -> Path:
    path = directory / "auth_token"
    if not path.is_file() or not path.read_text().strip():
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
        with os.fdopen(fd, "w") as f:
            f.write(secrets.token_hex(32))
    return path


def start_command(temp_dir: str, ports: dict[str, int], num_cpus: int) -> list[str]:
    argv = [sys.executable, "-m", "ray.scripts.scripts", "start", "--head", "--block", "--disable-usage-stats",
            f"--temp-dir={temp_dir}", "--node-ip-address=127.0.0.1", "--include-dashboard=false", "--dashboard-host=127.0.0.1",
            "--no-monitor"]  # one node of fixed size: no autoscaler (a process and ~45 MiB less)
    argv += [f"--{name}={port}" for name, port in ports.items()]
    return argv + ([f"--num-cpus={num_cpus}"] if num_cpus else [])


def _start_once(directory: Path, temp_dir: str, num_cpus: int, env: dict) -> tuple[subprocess.Popen, dict[str, int]]:
    """One `ray start`; returns it once its node is up, or raises RuntimeError (and stops it)."""
    ports = {name: free_port() for name in _PORTS}
    log_path = directory / "head.log"
    with open(log_path, "a") as log:
        offset = log.tell()  # what earlier heads and attempts wrote is not this one's
        head = subprocess.Popen(start_command(temp_dir, ports, num_cpus), stdin=subprocess.DEVNULL, stdout=log,
                                stderr=subprocess.STDOUT, env=env, cwd=temp_dir)
    deadline = time.monotonic() + UP_TIMEOUT
    while time.monotonic() < deadline:
        if head.poll() is not None:
            raise RuntimeError(f"`ray start` exited with {head.returncode} while starting (log {log_path})")
        if _raylet_gave_up(temp_dir):
            _end(head)
            raise RuntimeError(f"the raylet gave up while starting ({_session_dir(temp_dir)}/logs/raylet.err)")
        with open(log_path, errors="replace") as log:
            log.seek(offset)
            if "Ray runtime started" in log.read() and _session_dir(temp_dir) is not None:
                return head, ports
        time.sleep(0.2)
    _end(head)
    raise RuntimeError(f"`ray start` did not report its node up within {UP_TIMEOUT:.0f}s")


def _session_dir(temp_dir: str) -> str | None:
    latest = Path(temp_dir) / "session_latest"
    return os.path.realpath(latest) if latest.exists() else None


def _raylet_gave_up(temp_dir: str) -> bool:
    session = _session_dir(temp_dir)
    try:
        text = Path(session, "logs", "raylet.err").read_text(errors="replace") if session else ""
    except OSError:
        return False
    return any(marker in text for marker in _RAYLET_GAVE_UP)


def _end(head: subprocess.Popen) -> None:
    """Stop a `ray start --block` (it stops its node's processes on SIGTERM)."""
    if head.poll() is None:
        head.send_signal(signal.SIGTERM)
        with contextlib.suppress(subprocess.TimeoutExpired):
            head.wait(timeout=15)
    if head.poll() is None:
        head.kill()
        head.wait()


def start(directory: Path, num_cpus: int, env: dict, temp_dirs: list[str]) -> tuple[subprocess.Popen, dict[str, int], str]:
    """`ray start` until its node is up (ATTEMPTS at most); each attempt's temp dir goes in `temp_dirs`."""
    for attempt in range(1, ATTEMPTS + 1):
        temp_dir = tempfile.mkdtemp(prefix="zephyr-ray-", dir="/tmp" if os.path.isdir("/tmp") else None)
        temp_dirs.append(temp_dir)
        try:
            head, ports = _start_once(directory, temp_dir, num_cpus, env)
            return head, ports, temp_dir
        except RuntimeError as e:
            print(f"attempt {attempt}: {e}", flush=True)
            _kill_rest()
            shutil.rmtree(temp_dir, ignore_errors=True)
            if attempt == ATTEMPTS:
                raise
    raise AssertionError("unreachable")


def _kill_rest() -> None:
    """Kill every other process of this session (what a node left behind)."""
    kill_session(os.getpid(), start_time(os.getpid()) or 0)


def _idle(directory: Path, idle_s: float, since: float) -> bool:
    """No live run holds a lease, and none ended or began within `idle_s` seconds."""
    live, dead = leases(directory)
    if live:
        return False
    latest = since
    for lease in dead:  # a run that died holding it
        with contextlib.suppress(FileNotFoundError):
            latest = max(latest, lease.stat().st_mtime)
            lease.unlink()
    with contextlib.suppress(FileNotFoundError):
        latest = max(latest, (directory / "last_used").stat().st_mtime)
    return time.time() - latest >= idle_s


def _node_gone(head: subprocess.Popen) -> str | None:
    """Why the node is gone (its `ray start`, GCS server or raylet exited), or None."""
    if head.poll() is not None:
        return f"`ray start` exited ({head.returncode})"
    names = set()
    for pid in session_processes(os.getpid(), start_time(os.getpid()) or 0):
        with contextlib.suppress(OSError):
            names.add(Path(f"/proc/{pid}/comm").read_text().strip())
    missing = [name for name in _NODE if name not in names]
    return f"its {' and '.join(missing)} exited" if missing else None


def watch(directory: Path, head: subprocess.Popen, idle_s: float, since: float) -> str:
    """Until the head should stop; returns why."""
    while True:
        gone = _node_gone(head)
        if gone:
            return gone
        if _idle(directory, idle_s, since):
            stopping = directory / "stopping.json"
            os.replace(directory / "state.json", stopping)  # new runs no longer find it ...
            if _idle(directory, idle_s, since):  # ... and one that read it first holds a lease by now
                return f"unused for {idle_s / 60:g} minutes"
            os.replace(stopping, directory / "state.json")
        time.sleep(1.0)


def main(argv: list[str]) -> int:
    directory, idle_s, num_cpus = Path(argv[0]), float(argv[1]), int(argv[2])
    signal.signal(signal.SIGTERM, _raise_stop)
    head, state, temp_dirs = None, None, []
    try:
        env = head_env(ensure_token(directory))
        head, ports, temp_dir = start(directory, num_cpus, env, temp_dirs)
        me = os.getpid()
        state = HeadState(f"127.0.0.1:{ports['port']}", me, start_time(me) or 0, temp_dir, _session_dir(temp_dir) or "",
                          sys.executable, _ray_version(), env["RAY_AUTH_TOKEN_PATH"], idle_s, time.time(), num_cpus)
        write_state(directory, state)
        print(f"head up at {state.gcs_address} (session {state.session_dir})", flush=True)
        print(f"stopping: {watch(directory, head, idle_s, time.time())}", flush=True)
    except _Stop:
        print("stopping: asked to (SIGTERM)", flush=True)
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        if state is not None:
            forget_state(directory, state)
        with contextlib.suppress(FileNotFoundError):
            (directory / "stopping.json").unlink()
        if head is not None:
            _end(head)
        _kill_rest()
        for temp_dir in temp_dirs:
            shutil.rmtree(temp_dir, ignore_errors=True)
    return 0


def _ray_version() -> str:

    return version("ray")


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
