"""Which cluster a command talks to, and how to reach its job API with its token.

A `Target` is the `local` cluster or a row of the cluster table (named with `--cluster NAME`
or `--config infra/marin-NAME.yaml`). `job_client()` opens an authenticated
`JobSubmissionClient` to it: directly for `local`; for a cloud cluster through an existing
port-forward (`marin cluster dashboard`) or a temporary SSH tunnel.

`marin cluster dashboard` records each forward it holds open as `{cluster, port, pid}` in
`~/.marin/dashboards/port-<port>.json` (`$MARIN_DASHBOARD_DIR`). A job command reuses a
local port only when such a record names its cluster, the recorded ssh process is alive and
the port is listening; any other listener (another cluster's forward, an unrelated local
dashboard) is never sent the token.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shlex
import socket
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from zephyr.backends.ray_local import free_port
from zephyr.io.temporaries import process_alive

from marin.cluster import local
from marin.cluster.auth import auth_headers, read_token, redact, remote_token_path, write_private_file
from marin.cluster.commands import (
    DASHBOARD_PORT,
    format_command,
    gcloud_fetch_secret,
    gcloud_not_found,
    ray_get_head_ip,
    require_tools,
    run_command,
    ssh_tunnel,
)
from marin.cluster.config import (
    CLUSTERS,
    LOCAL_CLUSTER,
    ClusterSpec,
    cluster_from_config_file,
    config_path,
    get_cluster,
)

__all__ = ["Target", "job_client", "known_tokens", "resolve_target"]

NOT_RUNNING = "The local cluster is not running; start it with `marin cluster --cluster local start-cluster`"


@dataclass(frozen=True)
class Target:
    name: str
    spec: ClusterSpec | None = None
    config_file: Path | None = None  # an explicit --config path (e.g. a hand-edited copy)

    @property
    def is_local(self) -> bool:
        return self.spec is None

    @property
    def config(self) -> Path:
        if self.spec is None:
            raise ValueError("The local cluster has no launcher config: it is started by `start-cluster` directly")
        path = self.config_file or config_path(self.spec)
        with contextlib.suppress(ValueError):
            return path.relative_to(Path.cwd())
        return path

    @property
    def token_path(self) -> Path:
        if self.spec is None:
            return local.token_path(local.state_dir())
        return remote_token_path(self.spec.auth_secret)

    def token(self) -> str:
        if self.spec is not None and not self.token_path.is_file():
            fetch_token(self)  # first contact with a cloud cluster: cache its token
        hint = (
            "marin cluster --cluster local start-cluster"
            if self.is_local
            else f"marin cluster --cluster {self.name} auth"
        )
        return read_token(self.token_path, hint)


def fetch_token(target: Target, dry_run: bool = False) -> Path:
    """Copy a cloud cluster's token from Secret Manager into its private token file."""
    spec = target.spec
    if spec is None:
        raise ValueError("The local cluster's token is made by `start-cluster`, not fetched")
    argv = gcloud_fetch_secret(spec.auth_secret, spec.project)
    path = target.token_path
    if dry_run:
        print(f"{format_command(argv)} > {shlex.quote(str(path))}")
        return path
    result = run_command(argv, dry_run=False, capture=True, check=False)
    if result.returncode != 0:  # stderr only: stdout would be the secret
        detail = result.stderr.strip()[-1000:]
        if gcloud_not_found(detail):
            raise RuntimeError(
                f"Secret {spec.auth_secret} does not exist in {spec.project}. Create it once (it refuses to "
                f"overwrite one): `make init_ray_auth_token_secret CLUSTER={spec.name}` "
                f"(= `marin cluster --cluster {spec.name} init-auth-secret`)"
            )
        raise RuntimeError(f"Could not read secret {spec.auth_secret} in {spec.project}: {detail}")
    token = result.stdout.strip()
    if not token:
        raise RuntimeError(f"Secret {spec.auth_secret} in {spec.project} is empty")
    return write_private_file(path, token)


def resolve_target(cluster: str | None = None, config: str | None = None) -> Target:
    """The target named by `--cluster NAME|path.yaml` or `--config path.yaml`."""
    if cluster and config:
        raise ValueError("Give either --cluster or --config, not both")
    value = cluster or config
    if value is None:
        raise ValueError(
            "No cluster given: pass --cluster NAME (e.g. --cluster local) or --config infra/marin-NAME.yaml"
        )
    if value == LOCAL_CLUSTER:
        return Target(LOCAL_CLUSTER)
    if value.endswith((".yaml", ".yml")) or os.sep in value:
        return Target(cluster_from_config_file(value).name, cluster_from_config_file(value), Path(value).resolve())
    spec = get_cluster(value)
    return Target(spec.name, spec)


def _listening(port: int) -> bool:
    with socket.socket() as sock:
        return sock.connect_ex(("127.0.0.1", port)) == 0


def forwards_dir() -> Path:
    """Where `marin cluster dashboard` records the port-forwards it holds open."""
    return Path(os.environ.get("MARIN_DASHBOARD_DIR") or Path.home() / ".marin" / "dashboards")


def _forward_file(port: int) -> Path:
    return forwards_dir() / f"port-{int(port)}.json"


def record_forward(cluster: str, port: int, pid: int) -> Path:
    """Record that process `pid` forwards local `port` to `cluster`'s dashboard."""
    path = _forward_file(port)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"cluster": cluster, "port": int(port), "pid": int(pid)}))
    os.replace(tmp, path)
    return path


def clear_forward(port: int, pid: int) -> None:
    """Remove the record of `port` if it is still the one `pid` wrote."""
    path = _forward_file(port)
    with contextlib.suppress(OSError, ValueError):
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()


def forwarded_port(cluster: str) -> int | None:
    """A local port that `marin cluster dashboard` forwards to `cluster` right now, or None."""
    directory = forwards_dir()
    if not directory.is_dir():
        return None
    for path in sorted(directory.glob("port-*.json")):
        try:
            record = json.loads(path.read_text())
            port, pid = int(record["port"]), int(record["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            continue
        if record.get("cluster") == cluster and process_alive(pid) and _listening(port):
            return port
    return None


@contextlib.contextmanager
def dashboard_address(target: Target) -> Iterator[str]:
    """The job API address of `target`, with an SSH tunnel open while needed."""
    if target.is_local:
        cluster = local.load()
        if cluster is None:
            raise RuntimeError(NOT_RUNNING)
        yield cluster.dashboard_url
        return
    port = forwarded_port(target.name)
    if port is not None:  # `marin cluster dashboard` is forwarding to this very cluster
        yield f"http://127.0.0.1:{port}"
        return
    result = run_command(ray_get_head_ip(target.config), dry_run=False, capture=True)
    head_ip = result.stdout.strip().splitlines()[-1]
    require_tools("ssh", purpose=f"Reaching the job API of {target.name} through an SSH tunnel")
    port = free_port()
    proc = subprocess.Popen(ssh_tunnel(head_ip, {port: DASHBOARD_PORT}), stdin=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 30
        while not _listening(port):
            if proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"Could not open an SSH tunnel to the head of {target.name} ({head_ip})")
            time.sleep(0.2)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(timeout=10)


# Seconds a request to a cluster's job API may wait for an answer. Ray's job client sets no
# timeout, so a job server that accepts connections and never answers (a wedged dashboard) held
# every command (`job-logs`, `stop-job`, a launcher following its job) forever.
JOB_API_TIMEOUT = float(os.environ.get("MARIN_JOB_API_TIMEOUT", "60"))


@functools.cache
def _client_class():
    """Ray's `JobSubmissionClient` with a deadline on every request (imported on first use: Ray
    is slow to import and most commands never talk to a job API)."""
    import requests
    from ray.job_submission import JobSubmissionClient

    class Client(JobSubmissionClient):
        def _do_request(self, method: str, endpoint: str, **kwargs):
            kwargs.setdefault("timeout", JOB_API_TIMEOUT)
            try:
                return super()._do_request(method, endpoint, **kwargs)
            except requests.Timeout:
                raise TimeoutError(f"the Ray job API at {self._address} did not answer {method} {endpoint} within "
                                   f"{kwargs['timeout']:.0f}s (MARIN_JOB_API_TIMEOUT)") from None

    return Client


def connect(address: str, token: str | None):
    """An authenticated `JobSubmissionClient` whose requests time out; errors never carry the token."""
    try:
        return _client_class()(address, headers=auth_headers(token) if token else None)
    except Exception as e:  # Ray raises bare Exception/ConnectionError here
        raise ConnectionError(f"Could not connect to the Ray job API at {address}: {redact(str(e), token)}") from None


@contextlib.contextmanager
def job_client(target: Target):
    """Yield `(client, address)` for `target`'s job API."""
    if target.is_local and local.load() is None:
        raise RuntimeError(NOT_RUNNING)
    token = target.token()
    with dashboard_address(target) as address:
        yield connect(address, token), address


def known_tokens() -> list[str]:
    """Every token this machine could send (env, local cluster, cached cloud tokens): to scrub output."""
    tokens = [os.environ.get("RAY_AUTH_TOKEN", "")]
    paths = {local.token_path(local.state_dir()), Path.home() / ".ray" / "auth_token"}
    paths |= {remote_token_path(spec.auth_secret) for spec in CLUSTERS.values()}
    if env_path := os.environ.get("RAY_AUTH_TOKEN_PATH"):
        paths.add(Path(env_path))
    for path in paths:
        try:
            tokens.append(path.read_text().strip())
        except OSError:
            pass
    return [token for token in tokens if token]
