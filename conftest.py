"""Fixtures shared by every test suite in the workspace.

Real components only: a local GCS API server (`gcp-storage-emulator`) for `gs://` paths and
a real local Ray for the Ray backend. Environment variables are set before anything imports
gcsfs or starts Ray, so Ray workers started from this process inherit them.

Built for a shared, loaded 2-core CI machine: every wait has a deadline sized for it and says
what it waited for (`wait_until`), every Ray this session starts uses ports chosen free (never
Ray's defaults, which another user's Ray may hold), and clusters are torn down in finalizers
(`ray_cluster`) even when a test fails.
"""

from __future__ import annotations

import contextlib
import faulthandler
import hashlib
import http.client
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import urlsplit

import pytest

# gcsfs otherwise probes the bucket type over gRPC, which the emulator does not speak (~60 s).
os.environ.setdefault("GCSFS_EXPERIMENTAL_ZB_HNS_SUPPORT", "false")
# Workers of a local Ray started under `uv run` would otherwise re-enter `uv run` (+3 s each).
os.environ.setdefault("RAY_ENABLE_UV_RUN_RUNTIME_ENV", "0")
# Anonymous credentials for gs:// in tests: fsspec reads FSSPEC_<PROTOCOL>_<KWARG>.
os.environ.setdefault("FSSPEC_GCS_TOKEN", "anon")
os.environ.setdefault("RAY_DEDUP_LOGS", "0")
# JAX in tests: 8 simulated CPU devices per process (set before any test touches a backend),
# so meshes and sharded checkpoints are exercised for real.
if "xla_force_host_platform_device_count" not in os.environ.get("XLA_FLAGS", ""):
    os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "") + " --xla_force_host_platform_device_count=8").strip()
os.environ.setdefault("JAX_PLATFORMS", "cpu")
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
# Ray gives a starting raylet 30 s to register and a starting worker 60 s: on a loaded 2-core
# machine both take longer, and the node (or `ray start`) dies. Inherited by every Ray started
# from this session, `ray start` subprocesses included.
os.environ.setdefault("RAY_raylet_start_wait_time_s", "60")
os.environ.setdefault("RAY_worker_register_timeout_seconds", "300")
# Ray runs its workers at niceness 15, so other CPU-bound work on a shared CI machine starves
# them (tasks crawl at a few percent of a core); tests want their fair share.
os.environ.setdefault("RAY_worker_niceness", "0")
# A `ray start --block` node drains for 30 s on SIGTERM (for Serve); test nodes stop at once.
os.environ.setdefault("RAY_GRACEFUL_SHUTDOWN_DRAIN_TIMEOUT_S", "0")
# Second attempts of stragglers (on by default for users) off: on a loaded CI machine a shard a
# test holds at a gate, or one Ray retries after a node kill, can pass the 10 s threshold, and
# tests count attempts. The straggler tests (test_stragglers*.py) turn it on explicitly.
os.environ.setdefault("ZEPHYR_SPECULATION", "off")
# The `zephyr` command's Ray without an address: an embedded one per run, as before issue 41, not
# the local Ray it leaves running for reuse (test_ray_reuse.py tests that, in directories of its own).
os.environ.setdefault("ZEPHYR_LOCAL_RAY", "embedded")

# Property-based tests (hypothesis): CI runs a fixed seed and a bounded example count, so a
# run is reproducible and takes minutes; `HYPOTHESIS_PROFILE=nightly` explores far more
# (random seeds, 20x the examples); `HYPOTHESIS_PROFILE=dev` is random and quick. CI does not
# shrink a failure: each example runs a pipeline, so shrinking one can take longer than the
# test's timeout, whose exception hypothesis takes for the failure and shrinks on (a CI run
# once spent 14 minutes so, then its worker was ended and the run stalled). CI prints the
# failing example as drawn, with its `@reproduce_failure` blob; shrink it locally (dev profile).
from hypothesis import HealthCheck, Phase, settings  # noqa: E402

_SLOW_OK = [HealthCheck.too_slow, HealthCheck.data_too_large, HealthCheck.function_scoped_fixture]
settings.register_profile("ci", derandomize=True, max_examples=50, deadline=None, print_blob=True,
                          suppress_health_check=_SLOW_OK, database=None,
                          phases=(Phase.explicit, Phase.reuse, Phase.generate, Phase.target))
settings.register_profile("nightly", max_examples=1000, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
settings.register_profile("dev", max_examples=20, deadline=None, print_blob=True, suppress_health_check=_SLOW_OK)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))

# Deadlines for waits in tests: generous, because a loaded CI machine is slow, never a hang.
WAIT_TIMEOUT = 300.0


def free_port() -> int:
    """A TCP port that nothing listens on right now (zephyr's one finder, on loopback).

    Zephyr is imported here, not with this module: importing it takes seconds, which the pytest
    runs of `test_ci_watchdog.py` (this module as their plugin, in five processes) need not pay."""
    from zephyr.backends.ray_local import free_port as free_port_on

    return free_port_on("127.0.0.1")


def wait_until(condition, what: str, timeout: float = WAIT_TIMEOUT, interval: float = 0.05):
    """Poll `condition()` until it returns something truthy (returned); TimeoutError naming
    `what` after `timeout` seconds. Exceptions from `condition` propagate."""
    deadline = time.monotonic() + timeout
    while True:
        value = condition()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"waited {timeout:.0f}s for {what}")
        time.sleep(interval)


def _port_open(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


EMULATOR = os.path.join(os.path.dirname(__file__), "tests", "gcs_emulator.py")  # with generation semantics


@pytest.fixture(scope="session")
def gcs_emulator():
    """A GCS JSON API server on localhost; yields its endpoint and sets STORAGE_EMULATOR_HOST."""
    port = free_port()
    proc = subprocess.Popen(
        [sys.executable, EMULATOR, "start", "--host", "127.0.0.1", "--port", str(port), "--in-memory"],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    endpoint = f"http://127.0.0.1:{port}"
    # gcsfs reads STORAGE_EMULATOR_HOST; tensorstore (orbax's array storage) has its own
    # endpoint and test-token variables.
    settings = {"STORAGE_EMULATOR_HOST": endpoint, "TENSORSTORE_GCS_HTTP_URL": endpoint,
                "GOOGLE_AUTH_TOKEN_FOR_TESTING": "anonymous"}
    previous = {name: os.environ.get(name) for name in settings}
    os.environ.update(settings)
    try:
        wait_until(lambda: _port_open(port), f"the GCS emulator to listen on 127.0.0.1:{port}", timeout=120)
        yield endpoint
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
        for name, value in previous.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


@pytest.fixture
def gcs_bucket(gcs_emulator) -> str:
    """A fresh, empty bucket on the emulator, as a `gs://name` URL."""
    import fsspec

    name = f"test-{uuid.uuid4().hex[:12]}"
    fs = fsspec.filesystem("gs")
    fs.mkdir(name)
    fs.invalidate_cache()
    return f"gs://{name}"


DROP = -1  # FaultyGcs: drop the connection instead of answering


class FaultyGcs:
    """Forwards GCS JSON API requests to the emulator, failing some of them on purpose.

    - every `transient_every`-th request is answered 503 once (a retry of it then goes through);
    - any request whose URL contains one of `forbidden` is answered 403, always;
    - `outage(token, times, status)`: the next `times` requests whose URL or body contains
      `token` (uploads name their object in the body) are answered `status`, or with
      `status=None` their connection is dropped without an answer. Six in a row outlast
      gcsfs's own retries (six attempts, ~30 s of backoff) for one request.
    Every request's method and path is kept in `log`.
    """

    def __init__(self, upstream: str, transient_every: int = 0, forbidden: tuple[str, ...] = ()):
        self.upstream = urlsplit(upstream)
        self.transient_every = transient_every
        self.forbidden = forbidden
        self.outages: dict[str, list] = {}  # token -> [requests left to fail, status or None]
        self.requests = 0
        self.injected_transient = 0
        self.injected_permanent = 0
        self.injected_outage = 0
        self.log: list[str] = []
        self._lock = threading.Lock()
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *args):
                pass

            def _handle(self):
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else None
                status = proxy._fault_for(f"{self.command} {self.path}", body or b"")
                if status == DROP:  # the connection dies before any answer
                    self.close_connection = True
                    return
                if status:
                    payload = b'{"error": {"code": %d, "message": "injected fault"}}' % status
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(payload)))
                    self.end_headers()
                    self.wfile.write(payload)
                    return
                conn = http.client.HTTPConnection(proxy.upstream.hostname, proxy.upstream.port, timeout=60)
                headers = {k: v for k, v in self.headers.items() if k.lower() not in ("host", "connection")}
                conn.request(self.command, self.path, body=body, headers=headers)
                response = conn.getresponse()
                data = response.read()
                self.send_response(response.status)
                for key, value in response.getheaders():
                    if key.lower() not in ("transfer-encoding", "connection", "content-length"):
                        self.send_header(key, value)
                self.send_header("Content-Length", str(len(data)))
                self.end_headers()
                self.wfile.write(data)
                conn.close()

            do_GET = do_POST = do_PUT = do_DELETE = do_PATCH = do_HEAD = _handle

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.url = f"http://127.0.0.1:{self.server.server_address[1]}"
        threading.Thread(target=self.server.serve_forever, daemon=True).start()

    def outage(self, token: str, times: int, status: int | None = 503) -> None:
        with self._lock:
            self.outages[token] = [times, DROP if status is None else status]

    def _fault_for(self, request: str, body: bytes) -> int:
        with self._lock:
            self.requests += 1
            self.log.append(request)
            path = request.split(" ", 1)[1]
            for token, outage in self.outages.items():
                if (token in path or token.encode() in body) and outage[0] > 0:
                    outage[0] -= 1
                    self.injected_outage += 1
                    return outage[1]
            if any(token in path for token in self.forbidden):
                self.injected_permanent += 1
                return 403
            if self.transient_every and self.requests % self.transient_every == 0:
                self.injected_transient += 1
                return 503
            return 0

    def close(self):
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def faulty_gcs(gcs_emulator):
    """`faulty_gcs(transient_every=..., forbidden=...)` -> a FaultyGcs (its `.url` is the endpoint
    to use as STORAGE_EMULATOR_HOST); every proxy is shut down after the test."""
    proxies = []

    def make(**kwargs) -> FaultyGcs:
        proxy = FaultyGcs(gcs_emulator, **kwargs)
        proxies.append(proxy)
        return proxy

    yield make
    for proxy in proxies:
        proxy.close()


@pytest.fixture(scope="session")
def ray_local(gcs_emulator):
    """One local Ray with 2 CPUs, shared by the test run.

    Tests that need a multi-node `ray.cluster_utils.Cluster` shut this one down first; the
    next test that asks for this fixture starts it again. The GCS emulator starts first so
    that Ray's workers inherit STORAGE_EMULATOR_HOST.
    """
    import ray

    def ensure():
        if not ray.is_initialized():
            # a port chosen free, not Ray's default 8265 (which another user's Ray may hold)
            start_ray_node(lambda: ray.init(address="local", num_cpus=2, include_dashboard=False, dashboard_port=free_port(),
                                            log_to_driver=False, configure_logging=False),
                           "the session's local Ray", cleanup=ray.shutdown)
        return ray

    ensure()
    yield ensure
    ray.shutdown()


@pytest.fixture
def ray_shared(ray_local):
    """Function-scoped handle on the shared local Ray (restarted if a test shut it down)."""
    return ray_local()


# pytest-timeout (signal method: the test fails with a traceback and its finalizers still run).
# A Ray test that is not marked slow takes seconds; one that hangs fails after this, not after
# the 600 s that every other test gets.
QUICK_RAY_TEST_TIMEOUT = 300


# A hang that pytest-timeout's signal cannot end (a wait in C that never returns to Python, or
# code that catches its exception and waits on) would otherwise hold a CI run until CI's own limit,
# with nothing said. So a watchdog thread (faulthandler's, in C) fires HARD_TIMEOUT_GRACE seconds
# after the test's own timeout: it writes every thread's stack to the run's stderr and ends the
# worker process, which xdist reports as a crash of that test.
HARD_TIMEOUT_GRACE = float(os.environ.get("ZEPHYR_TESTS_HARD_TIMEOUT_GRACE", "240"))
# xdist (`--dist loadfile`) then runs the crashed test again in the worker that replaces the dead
# one, so a test that hangs or kills its worker would do it again. Each test leaves a mark in this
# directory (the controller's, inherited by the workers) while it runs; a test found marked was
# running when its worker died, and is skipped: the crash is already reported as its failure.
_RUNNING_DIR_ENV = "ZEPHYR_TESTS_RUNNING_DIR"
# Collecting takes seconds to a minute; a worker whose collection hangs (an import that waits
# forever) would never run its tests, and the run would wait for it until CI's limit.
COLLECTION_TIMEOUT = float(os.environ.get("ZEPHYR_TESTS_COLLECTION_TIMEOUT", "600"))
_watchdog_stream = None


def pytest_configure(config):
    global _watchdog_stream
    # pytest's capture is suspended while plugins configure: fd 2 is the run's own stderr here
    _watchdog_stream = os.fdopen(os.dup(2), "w")
    if _RUNNING_DIR_ENV not in os.environ:  # the controller (or a run without xdist): workers inherit it
        config._running_dir = tempfile.mkdtemp(prefix="pytest-running-")
        os.environ[_RUNNING_DIR_ENV] = config._running_dir


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    faulthandler.dump_traceback_later(COLLECTION_TIMEOUT, exit=True, file=_watchdog_stream)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()


def pytest_unconfigure(config):
    if getattr(config, "_running_dir", None):
        shutil.rmtree(config._running_dir, ignore_errors=True)
        os.environ.pop(_RUNNING_DIR_ENV, None)


@pytest.hookimpl(optionalhook=True)  # xdist's hook: without xdist (`-p no:xdist`) it is never called
def pytest_testnodedown(node, error):
    """When a worker dies (xdist says only "Not properly terminated"), say how: its exit status
    or signal, and the memory the machine had left (a SIGKILL with little left is the OOM killer)."""
    if not error:
        return
    popen = getattr(getattr(getattr(node, "gateway", None), "_io", None), "popen", None)  # execnet's, private
    status = None
    deadline = time.monotonic() + 10
    while popen is not None and (status := popen.poll()) is None and time.monotonic() < deadline:
        time.sleep(0.1)
    if status is None:
        how = "unknown"
    elif status < 0:
        how = f"killed by {signal.Signals(-status).name}"
    else:
        how = (f"exited with status {status} (os._exit or a C library's exit: the hang watchdog, whose stacks are "
               "then above, or Ray's driver after 60 s without its GCS)")
    available = next((line.split(":", 1)[1].strip() for line in _read_file("/proc/meminfo").splitlines()
                      if line.startswith("MemAvailable")), "?") if os.path.exists("/proc/meminfo") else "?"
    print(f"\n[{getattr(node.gateway, 'id', '?')}] the worker process {how}; memory available now: {available}",
          file=sys.stderr, flush=True)


def _test_timeout(item) -> float:
    marker = item.get_closest_marker("timeout")
    if marker is not None:
        value = marker.kwargs.get("timeout", marker.args[0] if marker.args else None)
        if value is not None:
            return float(value)
    return float(item.config.getini("timeout") or 0)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_protocol(item, nextitem):
    running = Path(os.environ[_RUNNING_DIR_ENV], hashlib.sha1(item.nodeid.encode()).hexdigest())
    if running.exists():
        item.add_marker(pytest.mark.skip(reason="its worker process died while running it (reported above as a "
                                                "crash); not run again"))
    running.write_text(item.nodeid)  # what each worker runs now, for a look from outside
    timeout = _test_timeout(item)
    if timeout > 0:
        faulthandler.dump_traceback_later(timeout + HARD_TIMEOUT_GRACE, exit=True, file=_watchdog_stream)
    try:
        yield
    finally:
        faulthandler.cancel_dump_traceback_later()
        running.unlink(missing_ok=True)


# The files that take longest (seconds of a serial run on this project's 2-core machine, 2026-11-27),
# heaviest first. With `-n 2 --dist loadfile` (pyproject) each worker takes the next file when it
# is nearly done with its own: started first, these do not end the run on one worker while the
# other idles. Only the wall time of a run depends on this list.
HEAVIEST_FIRST = (
    "tests/test_curate_web.py",  # ~300 (2026-11-28, on a loaded machine: two runs of the experiment, one on Ray)
    "lib/marin/tests/test_tpu_ray.py",  # 211
    "tests/test_resilience_storage.py",  # 179
    "lib/zephyr/tests/test_ray_reuse.py",  # ~170 (2026-11-29: 259 at load 10-12, 162 at load 2-3; 3 Ray head starts)
    "lib/marin/tests/test_cluster_local_e2e.py",  # 140
    "tests/test_benchmarks_smoke.py",  # 134
    "tests/test_seed_instructions.py",  # 92
    "lib/zephyr/tests/test_ray_cluster.py",  # 91
    "tests/test_quickstart.py",  # 69
    "tests/test_resilience_worker_loss.py",  # 67
    "lib/zephyr/tests/test_cli.py",  # 55
    "lib/marin/tests/test_tpu_checkpoint.py",  # 53
    "lib/zephyr/tests/test_cli_interrupt.py",  # 45
    "lib/zephyr/tests/test_roundtrip_properties.py",  # 44
    "lib/marin/tests/test_cluster_image.py",  # 41
    "tests/test_train_tiny_lm.py",  # 40
    # Files collected last (lib/marin's web tests, tests/): left in collection order they made the
    # run's tail, where a worker holding a file of 1-2 tests already has the next one queued (xdist
    # hands a worker more work once 2 or fewer of its tests are pending) and the other idles.
    # 2026-11-29, -n 0, load 3-4: so the last files are ~16 s or less.
    "tests/test_resilience_kill_rerun.py",  # 63
    "lib/marin/tests/test_web_quality.py",  # 54
    "tests/test_integration_test.py",  # 45
    "tests/test_ci_watchdog.py",  # 37-40
    "lib/marin/tests/test_tpu_preemption.py",  # 33 (CI's run of 2026-11-29)
    "lib/marin/tests/test_web_classifier.py",  # 28
)


def _run_order(item) -> int:
    path = item.nodeid.split("::", 1)[0]
    return HEAVIEST_FIRST.index(path) if path in HEAVIEST_FIRST else len(HEAVIEST_FIRST)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if item.get_closest_marker("ray") and not item.get_closest_marker("slow") and not item.get_closest_marker("timeout"):
            item.add_marker(pytest.mark.timeout(QUICK_RAY_TEST_TIMEOUT))
    items.sort(key=_run_order)  # stable: each file's tests stay together and in their order


RAY_ADDRESS_FILE = "/tmp/ray/ray_current_cluster"
NODE_START_ATTEMPTS = 3


@contextlib.contextmanager
def _sigint_at_its_default():
    """SIGINT handled by Python's default (a caught signal is reset to SIG_DFL in the processes
    this one execs), if it was ignored; the previous handler after."""
    previous = signal.getsignal(signal.SIGINT)
    if previous is not signal.SIG_IGN or threading.current_thread() is not threading.main_thread():
        yield
        return
    signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def start_ray_node(start, what: str, cleanup=None):
    """`start()` a Ray node, again (up to NODE_START_ATTEMPTS) if it died while starting.

    On a loaded machine a raylet gives up when its dashboard agent has not written its port
    within ~15 s (hard-coded in Ray), and the node never registers ("The current node timed
    out during startup"). A fresh attempt usually makes it; anything else is raised at once.

    The node starts with SIGINT at its default even when this run inherited it ignored (a test
    run started in the background of a script, POSIX): its workers inherit the disposition, and a
    worker that ignores SIGINT never gets the `KeyboardInterrupt` of `ray.cancel`.
    """
    for attempt in range(1, NODE_START_ATTEMPTS + 1):
        try:
            with _sigint_at_its_default():
                return start()
        except Exception as e:
            if "timed out during startup" not in str(e) or attempt == NODE_START_ATTEMPTS:
                raise
            print(f"{what} did not start (attempt {attempt}): {e}; retrying", file=sys.stderr)
            if cleanup is not None:
                cleanup()


class LocalRayCluster:
    """A multi-node Ray on this machine (`ray.cluster_utils.Cluster`) that leaves no trace.

    The head gets free ports for its dashboard and agent, so that another Ray on Ray's default
    ports does not matter; `close()` removes every node this test added and restores the
    machine-wide `ray_current_cluster` file, which `Cluster` overwrites and `Cluster.shutdown()`
    deletes even when it belongs to someone else's Ray.
    """

    def __init__(self, head_args: dict):
        from ray.cluster_utils import Cluster

        self._previous_address = _read_file(RAY_ADDRESS_FILE)
        self.cluster = Cluster(initialize_head=False)
        args = {"num_cpus": 0, "include_dashboard": False, "dashboard_port": free_port(),
                "dashboard_agent_listen_port": free_port(), **head_args}
        start_ray_node(lambda: self.cluster.add_node(**args), "the head node")
        self.address = self.cluster.address

    def add_node(self, **args):
        return start_ray_node(lambda: self.cluster.add_node(**args), "a worker node")

    def kill(self, node) -> None:
        """Remove `node` the way a preemption does: its processes are SIGKILLed."""
        self.cluster.remove_node(node, allow_graceful=False)

    def connect(self, **init_args):
        import ray

        ray.init(address=self.address, log_to_driver=False, **init_args)
        self.cluster.wait_for_nodes()
        return ray

    def close(self) -> None:
        import ray

        ray.shutdown()
        for node in list(self.cluster.worker_nodes):
            self.cluster.remove_node(node, allow_graceful=False)
        if self.cluster.head_node is not None:
            self.cluster.remove_node(self.cluster.head_node, allow_graceful=False)
        if _read_file(RAY_ADDRESS_FILE) == self.address:  # still ours: put back what was there
            _restore_file(RAY_ADDRESS_FILE, self._previous_address)


def _read_file(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read()
    except OSError:
        return None


def _restore_file(path: str, content: str | None) -> None:
    try:
        if content is None:
            os.remove(path)
        else:
            with open(path, "w") as f:
                f.write(content)
    except OSError:
        pass


def _ray_clusters():
    """Yield a starter of LocalRayClusters; every cluster it started is closed afterwards."""
    import ray

    started: list[LocalRayCluster] = []

    def start(**head_args) -> LocalRayCluster:
        ray.shutdown()
        started.append(LocalRayCluster(head_args))
        return started[-1]

    try:
        yield start
    finally:
        for cluster in reversed(started):
            cluster.close()


@pytest.fixture
def ray_cluster():
    """Start a multi-node Ray: `ray_cluster(**head_args)` -> LocalRayCluster (head: 0 CPUs by default).

    The session's shared local Ray is shut down first (the next test that wants it restarts
    it); every cluster started here is torn down after the test, pass or fail.
    """
    yield from _ray_clusters()


@pytest.fixture(scope="module")
def ray_cluster_module():
    """`ray_cluster` for a whole test module (torn down after its last test)."""
    yield from _ray_clusters()


@pytest.fixture(name="free_port")
def free_port_fixture():
    """`free_port()`: a TCP port that nothing listens on right now (the tests' one finder)."""
    return free_port


@pytest.fixture(name="wait_until")
def wait_until_fixture():
    """`wait_until(condition, what, timeout=WAIT_TIMEOUT)`: poll until truthy, else TimeoutError naming `what`."""
    return wait_until


def wait_for_line(proc: subprocess.Popen, line: str, timeout: float = 120) -> None:
    """Read `proc`'s stdout (a pipe) until `line` (a subprocess that prints it and goes on).
    Reads the pipe itself, only when `select` says there is something, so a silent process
    fails the test at the deadline instead of blocking it in `readline`."""
    import select

    deadline = time.monotonic() + timeout
    fd, pending = proc.stdout.fileno(), b""
    while line.encode() not in (part.strip() for part in pending.split(b"\n")):
        remaining = deadline - time.monotonic()
        assert remaining > 0, f"waited {timeout}s for {line!r}; got {pending[-200:]!r}"
        if select.select([fd], [], [], remaining)[0]:
            chunk = os.read(fd, 65536)
            assert chunk, f"the process ended (exit {proc.wait()}) before printing {line}"
            pending += chunk


@pytest.fixture(name="wait_for_line")
def wait_for_line_fixture():
    """`wait_for_line(proc, line, timeout=120)`: read a background process's stdout until `line`."""
    return wait_for_line


def signal_and_wait(proc: subprocess.Popen, signum: int, timeout: float = 60.0) -> float:
    """Send `signum` to `proc` and wait for it to exit; returns the seconds it took (a test
    prints them; the deadline only keeps a hung process from hanging the test)."""
    sent = time.monotonic()
    proc.send_signal(signum)
    try:
        proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        pytest.fail(f"the process did not exit within {timeout:.0f} s of signal {signum}")
    return time.monotonic() - sent


@pytest.fixture(name="signal_and_wait")
def signal_and_wait_fixture():
    """`signal_and_wait(proc, signum, timeout=60)` -> seconds from the signal to the process's exit."""
    return signal_and_wait


@pytest.fixture
def background():
    """`background(*popen_args, **popen_kwargs)`: start a process that is killed (and reaped)
    after the test, whether it passed or failed."""
    started: list[subprocess.Popen] = []

    def launch(*args, **kwargs) -> subprocess.Popen:
        started.append(subprocess.Popen(*args, **kwargs))
        return started[-1]

    yield launch
    for proc in started:
        proc.kill()
        proc.wait()
