"""Every external command line the cluster tooling runs (`ray`, `gcloud`, `ssh`), built here.

Builders are pure functions returning argv lists, so `--dry-run` prints exactly what would
run and tests can pin the command lines. None of them ever takes a token: tokens move through
files (Secret Manager -> token file) and HTTP headers only.
"""

from __future__ import annotations

import json
import shlex
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from marin.cluster.config import Capacity, ClusterSpec

__all__ = [
    "DASHBOARD_PORT",
    "format_command",
    "gcloud_create_tpu",
    "gcloud_fetch_secret",
    "gcloud_tpu_ssh",
    "local_generate_token",
    "local_ray_start",
    "ray_down",
    "ray_get_head_ip",
    "ray_up",
    "run_command",
    "ssh_tunnel",
    "worker_join_script",
]

DASHBOARD_PORT = 8265
GCS_PORT = 6379
SSH_KEY = "~/.ssh/marin_ray_cluster.pem"
SSH_USER = "ray"


def _ray() -> list[str]:
    # The `ray` of this interpreter's environment, whatever PATH says.
    return [sys.executable, "-m", "ray.scripts.scripts"]


def ray_up(config: Path) -> list[str]:
    return ["ray", "up", "-y", "--no-config-cache", str(config)]


def ray_down(config: Path) -> list[str]:
    return ["ray", "down", "-y", str(config)]


def ray_get_head_ip(config: Path) -> list[str]:
    return ["ray", "get-head-ip", str(config)]


def ssh_tunnel(head_ip: str, forwards: Mapping[int, int]) -> list[str]:
    """Port-forward `local_port -> head:remote_port` for each item until interrupted."""
    argv = [
        "ssh",
        "-N",
        "-o", "StrictHostKeyChecking=no",
        "-o", "UserKnownHostsFile=/dev/null",
        "-o", "ExitOnForwardFailure=yes",
        "-o", "ServerAliveInterval=30",
        "-i", SSH_KEY,
    ]  # fmt: skip
    for local, remote in forwards.items():
        argv += ["-L", f"{local}:localhost:{remote}"]
    return [*argv, f"{SSH_USER}@{head_ip}"]


def gcloud_fetch_secret(secret: str, project: str) -> list[str]:
    """Prints the secret's value on stdout: callers capture it, never echo it."""
    return ["gcloud", "secrets", "versions", "access", "latest", f"--secret={secret}", f"--project={project}"]


def gcloud_create_tpu(spec: ClusterSpec, name: str, tpu_type: str, capacity: Capacity) -> list[str]:
    """Create a TPU VM (best-effort capacity goes through a queued resource)."""
    where = [f"--zone={spec.zone}", f"--project={spec.project}"]
    if capacity is Capacity.BEST_EFFORT:
        return [
            "gcloud", "alpha", "compute", "tpus", "queued-resources", "create", name,
            f"--node-id={name}", f"--accelerator-type={tpu_type}",
            f"--runtime-version={spec.runtime_version}", "--best-effort", *where,
        ]  # fmt: skip
    flag = {Capacity.PREEMPTIBLE: "--preemptible", Capacity.RESERVED: "--reserved"}[capacity]
    return [
        "gcloud", "compute", "tpus", "tpu-vm", "create", name,
        f"--accelerator-type={tpu_type}", f"--version={spec.runtime_version}", flag, *where,
    ]  # fmt: skip


def worker_join_script(spec: ClusterSpec, head_ip: str) -> str:
    """Shell run on every host of a manual TPU worker: fetch the token, start Ray in the image."""
    token = "/home/ray/.ray/auth_token"
    fetch = shlex.join(gcloud_fetch_secret(spec.auth_secret, spec.project))
    start = (
        f"ray start --address={head_ip}:{GCS_PORT} --num-cpus={spec.worker_cpus} --block"
    )
    return (
        f"mkdir -p ~/.ray && umask 077 && {fetch} > ~/.ray/auth_token && "
        f"sudo docker run -d --name ray_docker --net=host --privileged --shm-size=32gb "
        f"-v ~/.ray/auth_token:{token}:ro -e RAY_AUTH_MODE=token -e RAY_AUTH_TOKEN_PATH={token} "
        f"-e MARIN_PREFIX={spec.bucket} {spec.docker_image} bash -c {shlex.quote(start)}"
    )


def gcloud_tpu_ssh(spec: ClusterSpec, name: str, command: str) -> list[str]:
    return [
        "gcloud", "compute", "tpus", "tpu-vm", "ssh", name, f"--zone={spec.zone}",
        f"--project={spec.project}", "--worker=all", f"--command={command}",
    ]  # fmt: skip


def local_generate_token() -> list[str]:
    """Run with HOME / RAY_AUTH_TOKEN_PATH pointing at the cluster's dir; prints the token (capture it)."""
    return [*_ray(), "get-auth-token", "--generate"]


def local_ray_start(
    *,
    temp_dir: Path,
    ports: Mapping[str, int],
    num_cpus: int,
    resources: Mapping[str, float],
    object_store_bytes: int,
    head_address: str | None = None,
) -> list[str]:
    """`ray start --block` for a local head (or, with `head_address`, a node joining it).

    Every port is explicit so that concurrent Ray instances on this machine never collide.
    """
    argv = [*_ray(), "start", "--block", "--disable-usage-stats", f"--temp-dir={temp_dir}"]
    if head_address is None:
        argv += [
            "--head",
            "--node-ip-address=127.0.0.1",
            f"--port={ports['gcs']}",
            "--dashboard-host=127.0.0.1",
            f"--dashboard-port={ports['dashboard']}",
            f"--ray-client-server-port={ports['client']}",
            "--include-dashboard=true",
        ]
    else:
        argv += [f"--address={head_address}", "--node-ip-address=127.0.0.1"]
    argv += [
        f"--node-manager-port={ports['node_manager']}",
        f"--object-manager-port={ports['object_manager']}",
        f"--dashboard-agent-listen-port={ports['agent_http']}",
        f"--dashboard-agent-grpc-port={ports['agent_grpc']}",
        f"--runtime-env-agent-port={ports['runtime_env_agent']}",
        f"--metrics-export-port={ports['metrics']}",
        f"--min-worker-port={ports['min_worker']}",
        f"--max-worker-port={ports['max_worker']}",
        f"--num-cpus={num_cpus}",
        f"--object-store-memory={object_store_bytes}",
        f"--resources={json.dumps(dict(resources), separators=(',', ':'))}",
    ]
    return argv


def format_command(argv: Sequence[str]) -> str:
    return shlex.join(argv)


def run_command(
    argv: Sequence[str],
    *,
    dry_run: bool,
    capture: bool = False,
    check: bool = True,
) -> subprocess.CompletedProcess | None:
    """Print `argv` (dry run) or run it; with `capture`, stdout is returned and never echoed."""
    if dry_run:
        print(format_command(argv))
        return None
    print(f"+ {format_command(argv)}", file=sys.stderr)
    result = subprocess.run(list(argv), text=True, capture_output=capture)
    if check and result.returncode != 0:
        # stderr only: stdout of a capturing call may be a secret.
        detail = f": {result.stderr.strip()[-2000:]}" if capture and result.stderr else ""
        raise RuntimeError(f"`{argv[0]} {argv[1] if len(argv) > 1 else ''}` exited with {result.returncode}{detail}")
    return result
