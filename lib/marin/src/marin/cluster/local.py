"""The `local` cluster: a token-auth Ray head on this machine that looks like a small TPU cluster.

`start()` runs `ray start --head --block` in its own process group with explicit free ports,
its own temp dir and simulated TPU resources (`{"TPU": 4, "TPU-v4-8-head": 1}`), after making
a token with `ray get-auth-token --generate` in the cluster's directory. Its state (ports,
process ids, temp dir, token path) lives in `state.json` under `state_dir()`
(`$MARIN_LOCAL_CLUSTER_DIR`, default `~/.marin/local-cluster`), so tests can isolate it.

`stop()` ends only the processes this cluster started (its process groups, then anything whose
command line names its private temp dir): never `ray stop`, which would kill every Ray on
the machine.

Made for a shared, busy machine: no port is one of Ray's defaults (another user's Ray may hold
6379 or 8265); ports come from below the kernel's ephemeral range, so that nothing takes them
between choosing and binding; a node (head or worker) that exits while starting is retried on
fresh ports (on a loaded machine a raylet gives up when its dashboard agent takes over ~15 s
to start); Ray's own startup deadlines are lengthened; and the head counts as up only once
its node is alive, not merely when its dashboard answers.
"""

from __future__ import annotations

import contextlib
import json
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import uuid
from dataclasses import asdict, dataclass, field
from pathlib import Path

from zephyr.io.temporaries import process_alive  # zombie-aware; shared with Zephyr's temp-file sweep

from marin.cluster.auth import auth_headers, read_token, redact
from marin.cluster.commands import format_command, local_generate_token, local_ray_start
from marin.cluster.procfs import cmdline_contains, descendants, find_processes, has_env_entry, listeners, signal_all, start_time
from marin.tpu.slices import tpu_head_resource

__all__ = [
    "HEAD_RESOURCES",
    "LocalCluster",
    "add_worker",
    "load",
    "start",
    "state_dir",
    "stop",
    "token_path",
]

STATE_ENV = "MARIN_LOCAL_CLUSTER_DIR"
MARKER_ENV = "MARIN_LOCAL_CLUSTER_ID"
HEAD_RESOURCES = {"TPU": 4, "TPU-v4-8-head": 1}
_WORKER_PORTS = 64
_PORT_BLOCK = 9 + _WORKER_PORTS  # the node's listeners, then its workers
# Ports come from below Linux's ephemeral range (32768+ by default), where outgoing connections
# and `bind(0)` land: a port chosen there could be taken before Ray binds it.
_QUIET_START = 20000
_EPHEMERAL_DEFAULT = (32768, 60999)
_OBJECT_STORE_BYTES = 256 * 1024 * 1024
_TOKEN_HINT = "marin cluster --cluster local start-cluster"
# How long a starting head or worker may take to come up on a loaded machine.
_START_TIMEOUT = 300.0
_START_ATTEMPTS = 3  # a node that exits while starting (e.g. a port taken) is retried on new ones
_PORT_TAKEN = ("address already in use", "already occupied", "failed to bind")
# Ray's startup deadlines (raylet registration 30 s, worker registration 60 s) are too short for
# a loaded 2-core machine; a user's own settings win. (A raylet that died starting is found by
# `ray start` only after the first, so it stays short enough for a retry to fit.)
_PATIENT_RAY = {"RAY_raylet_start_wait_time_s": "60", "RAY_worker_register_timeout_seconds": "300"}


@dataclass
class LocalNode:
    pid: int
    ports: dict[str, int]
    resources: dict[str, float]


@dataclass
class LocalCluster:
    """A running local cluster, as recorded in its state file."""

    directory: str
    temp_dir: str
    num_cpus: int
    head: LocalNode
    marker: str = ""
    workers: list[LocalNode] = field(default_factory=list)

    @property
    def dashboard_url(self) -> str:
        return f"http://127.0.0.1:{self.head.ports['dashboard']}"

    @property
    def gcs_address(self) -> str:
        return f"127.0.0.1:{self.head.ports['gcs']}"

    @property
    def token_path(self) -> Path:
        return token_path(Path(self.directory))


def state_dir() -> Path:
    return Path(os.environ.get(STATE_ENV) or Path.home() / ".marin" / "local-cluster")


def token_path(directory: Path) -> Path:
    return directory / "home" / ".ray" / "auth_token"


def _state_file(directory: Path) -> Path:
    return directory / "state.json"


def _members(cluster: LocalCluster) -> list[int]:
    """Live processes of this cluster: those tagged with its marker (`MARIN_LOCAL_CLUSTER_ID`).

    Only the marker counts: a recorded node pid (and so its session id) may belong to an
    unrelated process once the node is dead (PID reuse). A state file from before markers
    falls back to the sessions of node pids that are still alive. Reads Linux /proc;
    elsewhere only the nodes' own processes are known.
    """
    nodes = {n.pid for n in (cluster.head, *cluster.workers)}
    if not Path("/proc").is_dir():
        return [pid for pid in nodes if process_alive(pid)]
    if cluster.marker:
        return find_processes(env_entry=_marker_entry(cluster))
    return find_processes(sessions=[pid for pid in nodes if process_alive(pid)])  # `ray start` leads its session


def _snapshot(cluster: LocalCluster) -> dict[int, int]:
    """{pid: start time} of the cluster's processes now: its members and every process they
    started. Ray's dashboard and runtime-env agents rename themselves, which blanks the
    environment /proc shows (so no marker), and outlived a stop holding the cluster's ports;
    they are found here through their parents, while those still live."""
    members = _members(cluster)
    return {pid: t for pid in dict.fromkeys([*members, *descendants(members)]) if (t := start_time(pid)) is not None}


def _still_running(snapshot: dict[int, int]) -> list[int]:
    """The processes of `snapshot` still alive (same pid and start time: not a reused pid)."""
    return [pid for pid, started in snapshot.items() if start_time(pid) == started]


def _marker_entry(cluster: LocalCluster) -> bytes:
    return f"{MARKER_ENV}={cluster.marker}".encode()


def _read_state(directory: Path) -> LocalCluster | None:
    path = _state_file(directory)
    if not path.is_file():
        return None
    data = json.loads(path.read_text())
    data["head"] = LocalNode(**data["head"])
    data["workers"] = [LocalNode(**w) for w in data["workers"]]
    return LocalCluster(**data)


def load(directory: Path | None = None) -> LocalCluster | None:
    """The running local cluster recorded in `directory`, or None (stale state is removed)."""
    cluster = _read_state(directory or state_dir())
    if cluster is None:
        return None
    if not process_alive(cluster.head.pid):
        _cleanup(cluster)
        return None
    return cluster


def _save(cluster: LocalCluster) -> None:
    path = _state_file(Path(cluster.directory))
    path.write_text(json.dumps(asdict(cluster), indent=2))
    path.chmod(0o600)


def _token_env(directory: Path, marker: str = "") -> dict[str, str]:
    """Environment for Ray processes of this cluster: token mode, token file, nothing inherited.

    `marker` tags every process of the cluster, job drivers included (Ray starts those in
    sessions of their own), so that `stop()` finds exactly them.
    """
    env = dict(os.environ)
    if marker:
        env[MARKER_ENV] = marker
    env.pop("RAY_AUTH_TOKEN", None)
    env.pop("RAY_ADDRESS", None)
    env["RAY_AUTH_MODE"] = "token"
    env["RAY_AUTH_TOKEN_PATH"] = str(token_path(directory))
    env.setdefault("RAY_USAGE_STATS_ENABLED", "0")
    # What a cloud cluster's bucket is to its jobs: experiments submitted without --prefix write here.
    env.setdefault("MARIN_PREFIX", str(directory / "prefix"))
    for key, value in _PATIENT_RAY.items():
        env.setdefault(key, value)
    # Job entrypoints run `python`: make it this environment's interpreter.
    env["PATH"] = os.pathsep.join([str(Path(sys.executable).parent), env.get("PATH", "")])
    return env


def ensure_token(directory: Path) -> Path:
    """Make the cluster's token with `ray get-auth-token --generate` unless it exists."""
    path = token_path(directory)
    if path.is_file() and path.read_text().strip():
        return path
    path.parent.mkdir(parents=True, exist_ok=True)
    path.parent.chmod(0o700)
    env = _token_env(directory)
    # Ray refuses a RAY_AUTH_TOKEN_PATH that does not exist yet; it writes to $HOME/.ray/auth_token.
    env.pop("RAY_AUTH_TOKEN_PATH")
    env["HOME"] = str(directory / "home")
    # The command prints the token on stdout: discard it.
    argv = local_generate_token()
    result = subprocess.run(argv, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    if result.returncode != 0 or not path.is_file():
        detail = result.stderr.strip()[-1000:]
        raise RuntimeError(f"`ray get-auth-token --generate` failed ({result.returncode}): {detail}")
    path.chmod(0o600)
    return path


def _port_free(port: int) -> bool:
    """Nothing listens on `port` on any address (Ray binds 0.0.0.0 or the node's address)."""
    with socket.socket() as sock:
        try:
            sock.bind(("", port))
        except OSError:
            return False
    return True


def _quiet_range() -> tuple[int, int]:
    """Ports the kernel never hands out on its own: below its ephemeral range (where outgoing
    connections and `bind(0)` land), so a port found free stays free until Ray binds it."""
    low, _ = _EPHEMERAL_DEFAULT
    with contextlib.suppress(OSError, ValueError):
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    return _QUIET_START, max(_QUIET_START + 2 * _PORT_BLOCK, low)


def _free_ports() -> dict[str, int]:
    """A block of consecutive free ports for one node: every listener, then its workers' range.

    Drawn at random from the quiet range (never Ray's defaults), so concurrent clusters and
    other users' Rays on the machine do not collide with it.
    """
    names = ["gcs", "dashboard", "client", "node_manager", "object_manager", "agent_http", "agent_grpc"]
    names += ["runtime_env_agent", "metrics"]
    first, last = _quiet_range()
    for _ in range(200):
        base = random.randrange(first, last - _PORT_BLOCK)
        if all(_port_free(p) for p in range(base, base + _PORT_BLOCK)):
            ports = {name: base + i for i, name in enumerate(names)}
            ports["min_worker"], ports["max_worker"] = base + len(names), base + _PORT_BLOCK - 1
            return ports
    raise RuntimeError(f"Could not find {_PORT_BLOCK} consecutive free ports in {first}-{last}")


def _log_tail(path: Path, token: str | None) -> str:
    try:
        text = path.read_text(errors="replace")[-3000:]
    except FileNotFoundError:
        return ""
    return redact(text, token)


class _NodeExited(RuntimeError):
    """A node's `ray start` ended while starting; `port_taken` when one of its ports was in use."""

    def __init__(self, message: str, port_taken: bool):
        super().__init__(message)
        self.port_taken = port_taken


def _wait_ready(url: str, token: str, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait until the dashboard's nodes API (authenticated) lists the head's own node alive.

    The dashboard answers before the head's raylet has registered; a head whose raylet never
    registers dies a little later, so answering alone does not make it ready.
    """
    try:
        _wait_for_nodes(url, token, 1, proc, log, timeout)
    except RuntimeError as e:
        tail = _log_tail(log, token)
        if proc.poll() is None:
            raise
        taken = any(marker in tail.lower() for marker in _PORT_TAKEN)
        raise _NodeExited(f"The local Ray head exited with {proc.returncode}; log tail:\n{tail}", taken) from e


def _spawn(argv: list[str], directory: Path, log_name: str, marker: str) -> tuple[subprocess.Popen, Path]:
    log = directory / log_name
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            argv, env=_token_env(directory, marker), stdout=out, stderr=subprocess.STDOUT, start_new_session=True
        )
    return proc, log


def _head_command(temp_dir: Path, ports: dict[str, int], num_cpus: int) -> list[str]:
    return local_ray_start(
        temp_dir=temp_dir,
        ports=ports,
        num_cpus=num_cpus,
        resources=HEAD_RESOURCES,
        object_store_bytes=_OBJECT_STORE_BYTES,
    )


def start(directory: Path | None = None, *, num_cpus: int | None = None, dry_run: bool = False) -> LocalCluster | None:
    """Start the local head (or return the running one); with `dry_run`, print its command line."""
    directory = directory or state_dir()
    num_cpus = num_cpus if num_cpus is not None else int(os.environ.get("MARIN_LOCAL_NUM_CPUS", "2"))
    if dry_run:
        ports = _free_ports()
        temp = Path(tempfile.gettempdir()) / "marin-ray-XXXXXX"
        argv = _head_command(temp, ports, num_cpus)
        print(format_command(local_generate_token()))
        print(format_command(argv))
        return None
    if (running := load(directory)) is not None:
        print(f"Local cluster already running at {running.dashboard_url}", file=sys.stderr)
        return running
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    token = read_token(ensure_token(directory), _TOKEN_HINT)
    return _with_retries(lambda timeout: _start_head(directory, token, num_cpus, timeout), "head")


def _with_retries(start_once, what: str):
    """`start_once(timeout)` up to `_START_ATTEMPTS` times while the node exits as it starts
    (a port taken meanwhile; on a loaded machine, a raylet that gave up on its slow agent),
    all attempts within `_START_TIMEOUT` seconds."""
    deadline = time.monotonic() + _START_TIMEOUT
    for attempt in range(1, _START_ATTEMPTS):
        try:
            return start_once(deadline - time.monotonic())
        except _NodeExited as e:
            why = "one of its ports was taken meanwhile" if e.port_taken else "it exited while starting"
            print(f"The local Ray {what} did not start ({why}); retrying on new ports ({attempt})", file=sys.stderr)
    return start_once(deadline - time.monotonic())


def _start_head(directory: Path, token: str, num_cpus: int, timeout: float) -> LocalCluster:
    """One attempt: start the head on fresh free ports; on any failure stop what it started."""
    # Short, private temp dir: Ray's unix socket paths must stay under ~107 characters.
    temp_dir = Path(tempfile.mkdtemp(prefix="marin-ray-"))
    ports = _free_ports()
    argv = _head_command(temp_dir, ports, num_cpus)
    marker = f"{os.getpid()}-{uuid.uuid4().hex}"
    proc, log = _spawn(argv, directory, "head.log", marker)
    head = LocalNode(proc.pid, ports, dict(HEAD_RESOURCES))
    cluster = LocalCluster(str(directory), str(temp_dir), num_cpus, head, marker)
    _save(cluster)
    try:
        _wait_ready(cluster.dashboard_url, token, proc, log, timeout=timeout)
    except BaseException:
        stop(directory)
        raise
    return cluster


def add_worker(
    tpu_type: str, directory: Path | None = None, *, num_cpus: int = 1, dry_run: bool = False
) -> LocalNode | None:
    """Join a node with `num_cpus` CPUs that looks like a `tpu_type` slice host."""
    directory = directory or state_dir()
    cluster = load(directory)
    if cluster is None and not dry_run:
        raise RuntimeError(f"The local cluster is not running; start it with `{_TOKEN_HINT}`")
    resources = {"TPU": 4, tpu_head_resource(tpu_type): 1}
    if dry_run:
        temp_dir = Path(cluster.temp_dir) if cluster else Path(tempfile.gettempdir()) / "marin-ray-XXXXXX"
        address = cluster.gcs_address if cluster else "127.0.0.1:GCS_PORT"
        print(format_command(_worker_command(temp_dir, _free_ports(), num_cpus, resources, address)))
        return None
    token = read_token(cluster.token_path, _TOKEN_HINT)
    return _with_retries(lambda timeout: _start_worker(cluster, token, num_cpus, resources, timeout), "worker")


def _worker_command(temp_dir: Path, ports: dict[str, int], num_cpus: int, resources: dict, address: str) -> list[str]:
    return local_ray_start(
        temp_dir=temp_dir,
        ports=ports,
        num_cpus=num_cpus,
        resources=resources,
        object_store_bytes=_OBJECT_STORE_BYTES,
        head_address=address,
    )


def _start_worker(cluster: LocalCluster, token: str, num_cpus: int, resources: dict, timeout: float) -> LocalNode:
    """One attempt: a worker on fresh ports; if it exits while joining, its processes are ended."""
    ports = _free_ports()
    argv = _worker_command(Path(cluster.temp_dir), ports, num_cpus, resources, cluster.gcs_address)
    proc, log = _spawn(argv, Path(cluster.directory), f"worker-{len(cluster.workers)}.log", cluster.marker)
    node = LocalNode(proc.pid, ports, resources)
    cluster.workers.append(node)
    _save(cluster)
    try:
        _wait_for_nodes(cluster.dashboard_url, token, 1 + len(cluster.workers), proc, log, timeout)
    except RuntimeError as e:  # it exited: forget it, end what it left (its own process group)
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        cluster.workers.remove(node)
        _save(cluster)
        tail = _log_tail(log, token)
        raise _NodeExited(str(e), any(marker in tail.lower() for marker in _PORT_TAKEN)) from e
    return node


def _wait_for_nodes(url: str, token: str, count: int, proc: subprocess.Popen, log: Path, timeout: float) -> None:
    """Wait until the head at `url` lists `count` live nodes, while `proc` (the node being
    started) runs; RuntimeError with its log tail if it exits, TimeoutError after `timeout`."""
    deadline = time.monotonic() + timeout
    request = urllib.request.Request(f"{url}/api/v0/nodes", headers=auth_headers(token))
    alive = 0
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"The local Ray node exited with {proc.returncode}; log tail:\n{_log_tail(log, token)}")
        try:
            with urllib.request.urlopen(request, timeout=10) as response:
                nodes = json.load(response)["data"]["result"]["result"]
            alive = sum(n.get("state") == "ALIVE" for n in nodes)
            if alive >= count:
                return
        except (urllib.error.URLError, ConnectionError, TimeoutError, KeyError, ValueError):
            pass
        time.sleep(0.5)
    raise TimeoutError(
        f"Waited {timeout:.0f}s for {count} live node(s) at {url} (saw {alive}); see {log}"
    )


def _stragglers(cluster: LocalCluster) -> list[int]:
    """Processes of `cluster` still alive, the renamed children of its members included (for
    tests and `stop`)."""
    return list(_snapshot(cluster))


def _cleanup(cluster: LocalCluster, grace: float = 3.0, port_wait: float = 15.0) -> dict[int, list[int]]:
    """SIGTERM every process of the cluster, SIGKILL what is left after `grace` seconds, then
    make sure its ports are free: a process of the cluster still listening on one (Ray's
    dashboard and runtime-env agents once outlived a stop for minutes) is killed too.
    Returns {port: [pids]} of ports still held by processes that are not the cluster's."""
    snapshot = _snapshot(cluster)  # before any of them dies: children are known by their parents
    signal_all(snapshot, signal.SIGTERM)
    deadline = time.monotonic() + grace
    while (_members(cluster) or _still_running(snapshot)) and time.monotonic() < deadline:
        time.sleep(0.1)
    held: dict[int, list[int]] = {}
    deadline = time.monotonic() + port_wait
    while True:
        left = set(_members(cluster)) | set(_still_running(snapshot))
        held = listeners(_cluster_ports(cluster))
        left |= {pid for pids in held.values() for pid in pids if _is_cluster_process(cluster, pid) or pid in left}
        if not left or time.monotonic() > deadline:  # what still holds a port is not ours
            break
        signal_all(sorted(left), signal.SIGKILL)
        time.sleep(0.2)
    shutil.rmtree(cluster.temp_dir, ignore_errors=True)
    _state_file(Path(cluster.directory)).unlink(missing_ok=True)
    return held


def _cluster_ports(cluster: LocalCluster) -> set[int]:
    """The fixed ports the cluster's nodes listen on (not the worker port range)."""
    return {port for node in (cluster.head, *cluster.workers) for name, port in node.ports.items()
            if name not in ("min_worker", "max_worker") and isinstance(port, int)}


def _is_cluster_process(cluster: LocalCluster, pid: int) -> bool:
    """Tagged with the cluster's marker, or running from its session directory."""
    return (bool(cluster.marker) and has_env_entry(pid, _marker_entry(cluster))) or cmdline_contains(pid, cluster.temp_dir)


def stop(directory: Path | None = None, *, dry_run: bool = False) -> bool:
    """Stop every process of the local cluster; True if one was recorded. The token is kept."""
    cluster = _read_state(directory or state_dir())
    if cluster is None:
        return False
    if dry_run:
        pids = " ".join(str(pid) for pid in _snapshot(cluster))
        print(f"kill -TERM {pids}  # then -KILL after 3s: processes tagged {MARKER_ENV}={cluster.marker}")
        return True
    held = _cleanup(cluster)
    for port, pids in sorted(held.items()):
        print(f"warning: port {port} of the stopped local cluster is held by process(es) {pids}, which are not "
              "the cluster's; the next start-cluster picks other ports", file=sys.stderr)
    return True
