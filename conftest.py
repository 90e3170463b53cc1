"""Fixtures shared by every test suite in the workspace.

Real components only: a local GCS API server (`gcp-storage-emulator`) for `gs://` paths and
a real local Ray for the Ray backend. Environment variables are set before anything imports
gcsfs or starts Ray, so Ray workers started from this process inherit them.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import time
import uuid

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


def free_port() -> int:
    """A TCP port that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _wait_for_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        with socket.socket() as sock:
            if sock.connect_ex(("127.0.0.1", port)) == 0:
                return
        time.sleep(0.05)
    raise TimeoutError(f"nothing listened on 127.0.0.1:{port} after {timeout}s")


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
        _wait_for_port(port, timeout=30)
        yield endpoint
    finally:
        proc.terminate()
        proc.wait(timeout=10)
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
            ray.init(address="local", num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
        return ray

    ensure()
    yield ensure
    ray.shutdown()


@pytest.fixture
def ray_shared(ray_local):
    """Function-scoped handle on the shared local Ray (restarted if a test shut it down)."""
    return ray_local()
