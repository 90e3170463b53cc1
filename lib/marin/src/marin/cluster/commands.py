"""Every external command line the cluster tooling runs (`ray`, `gcloud`, `ssh`), built here.

Builders are pure functions returning argv lists, so `--dry-run` prints exactly what would
run and tests can pin the command lines. None of them ever takes a token: tokens move through
files (Secret Manager -> token file) and HTTP headers only.
"""

from __future__ import annotations

import json
import shlex
import shutil
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path

from marin.cluster.config import Capacity, ClusterSpec

__all__ = [
    "DASHBOARD_PORT",
    "MissingToolError",
    "docker_build",
    "docker_daemon_check",
    "docker_push",
    "docker_tag",
    "format_command",
    "gcloud_configure_docker",
    "gcloud_create_repository",
    "gcloud_create_secret",
    "gcloud_create_tpu",
    "gcloud_delete_queued_resource",
    "gcloud_delete_tpu",
    "gcloud_describe_repository",
    "gcloud_describe_secret",
    "gcloud_fetch_secret",
    "gcloud_grant_secret_access",
    "gcloud_list_tpus",
    "gcloud_not_found",
    "gcloud_set_cleanup_policies",
    "gcloud_tpu_ssh",
    "git_short_commit",
    "git_status",
    "local_generate_token",
    "local_ray_start",
    "ray_down",
    "ray_get_head_ip",
    "ray_up",
    "require_tools",
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


def gcloud_describe_secret(secret: str, project: str) -> list[str]:
    """Exits 0 when the secret exists (prints its metadata, never its value)."""
    return ["gcloud", "secrets", "describe", secret, f"--project={project}", "--format=value(name)"]


def gcloud_create_secret(secret: str, project: str, data_file: Path) -> list[str]:
    """Create `secret` with its first version read from `data_file` (the value never enters argv)."""
    return [
        "gcloud", "secrets", "create", secret, f"--project={project}",
        "--replication-policy=automatic", f"--data-file={data_file}",
    ]  # fmt: skip


def gcloud_grant_secret_access(secret: str, project: str, service_account: str) -> list[str]:
    """Let `service_account` (the cluster's nodes) read `secret`'s versions."""
    return [
        "gcloud", "secrets", "add-iam-policy-binding", secret, f"--project={project}",
        f"--member=serviceAccount:{service_account}", "--role=roles/secretmanager.secretAccessor",
    ]  # fmt: skip


def gcloud_list_tpus(zone: str, project: str) -> list[str]:
    """Every TPU VM of the zone, whatever its state, as JSON (the TPU API's `Node` records)."""
    return ["gcloud", "compute", "tpus", "tpu-vm", "list", f"--zone={zone}", f"--project={project}", "--format=json"]


def gcloud_delete_tpu(name: str, zone: str, project: str) -> list[str]:
    return [
        "gcloud", "compute", "tpus", "tpu-vm", "delete", name,
        f"--zone={zone}", f"--project={project}", "--quiet", "--async",
    ]  # fmt: skip


def gcloud_delete_queued_resource(name: str, zone: str, project: str) -> list[str]:
    """Delete a queued resource and, `--force`, the TPU VMs it holds (which `tpu-vm delete` refuses)."""
    return [
        "gcloud", "compute", "tpus", "queued-resources", "delete", name,
        f"--zone={zone}", f"--project={project}", "--force", "--quiet", "--async",
    ]  # fmt: skip


def gcloud_not_found(stderr: str) -> bool:
    """Whether a failed gcloud call said the resource does not exist (rather than, say, PERMISSION_DENIED)."""
    return "NOT_FOUND" in stderr or "not found" in stderr.lower()


def gcloud_describe_repository(repository: str, region: str, project: str) -> list[str]:
    """Exits 0 when the Artifact Registry repository exists."""
    return [
        "gcloud", "artifacts", "repositories", "describe", repository,
        f"--location={region}", f"--project={project}", "--format=value(name)",
    ]  # fmt: skip


def gcloud_create_repository(repository: str, region: str, project: str) -> list[str]:
    return [
        "gcloud", "artifacts", "repositories", "create", repository, "--repository-format=docker",
        f"--location={region}", f"--project={project}", "--description=Marin cluster images",
    ]  # fmt: skip


def gcloud_configure_docker(region: str) -> list[str]:
    """Let `docker push` authenticate to the region's registry host with gcloud's credentials."""
    return ["gcloud", "auth", "configure-docker", f"{region}-docker.pkg.dev", "--quiet"]


def gcloud_set_cleanup_policies(repository: str, region: str, project: str | None, policy: Path) -> list[str]:
    """Replace the repository's cleanup policies by those in `policy`, deleting for real (`--no-dry-run`).

    Without `project`, gcloud uses its configured project (`gcloud config get project`).
    """
    return [
        "gcloud", "artifacts", "repositories", "set-cleanup-policies", repository, f"--location={region}",
        *([f"--project={project}"] if project else []), f"--policy={policy}", "--no-dry-run",
    ]  # fmt: skip


def docker_daemon_check() -> list[str]:
    """Fails (non-zero) when the docker CLI cannot reach a daemon."""
    return ["docker", "info", "--format={{.ServerVersion}}"]


def docker_build(dockerfile: Path, image: str, context: Path) -> list[str]:
    # Cluster nodes (n2 heads, TPU VM hosts) are x86-64 whatever machine builds the image; --pull
    # takes the base image's current patch release rather than whatever this machine has cached.
    return [
        "docker", "build", "--pull", "--platform=linux/amd64", f"--file={dockerfile}", f"--tag={image}", str(context),
    ]  # fmt: skip


def docker_tag(source: str, target: str) -> list[str]:
    return ["docker", "tag", source, target]


def docker_push(ref: str) -> list[str]:
    return ["docker", "push", ref]


def git_short_commit(repo: Path) -> list[str]:
    return ["git", "-C", str(repo), "rev-parse", "--short", "HEAD"]


def git_status(repo: Path) -> list[str]:
    """Uncommitted changes, one per line (empty when the work tree is clean)."""
    return ["git", "-C", str(repo), "status", "--porcelain"]


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


_INSTALL_HINTS = {
    "gcloud": "install the Google Cloud CLI (https://cloud.google.com/sdk/docs/install), then `gcloud auth login`",
    "docker": "install Docker (https://docs.docker.com/engine/install/) and start its daemon",
    "ray": "run `uv sync` and call this through `uv run` so the project's Ray is on PATH",
    "ssh": "install an OpenSSH client",
    "git": "install git",
}


class MissingToolError(RuntimeError):
    """An external command this step needs is not installed (or not on PATH)."""


def require_tools(*tools: str, purpose: str) -> None:
    """Refuse before anything runs when a tool `purpose` needs is missing, naming how to get it."""
    missing = [tool for tool in tools if shutil.which(tool) is None]
    if missing:
        hints = "; ".join(f"`{tool}`: {_INSTALL_HINTS.get(tool, 'install it')}" for tool in missing)
        raise MissingToolError(f"{purpose} needs {', '.join(missing)}, not found on PATH ({hints})")


def run_command(
    argv: Sequence[str],
    *,
    dry_run: bool,
    capture: bool = False,
    check: bool = True,
    quiet: bool = False,
) -> subprocess.CompletedProcess | None:
    """Print `argv` (dry run) or run it; with `capture`, stdout is returned and never echoed.

    A tool missing from PATH raises `MissingToolError` (a dry run only prints, so needs none).
    With `quiet`, the command is not echoed to stderr (a probe whose failure is expected).
    """
    if dry_run:
        print(format_command(argv))
        return None
    require_tools(argv[0], purpose=f"`{' '.join(argv[:2])}`")
    if not quiet:
        print(f"+ {format_command(argv)}", file=sys.stderr)
    result = subprocess.run(list(argv), text=True, capture_output=capture)
    if check and result.returncode != 0:
        # stderr only: stdout of a capturing call may be a secret.
        detail = f": {result.stderr.strip()[-2000:]}" if capture and result.stderr else ""
        raise RuntimeError(f"`{argv[0]} {argv[1] if len(argv) > 1 else ''}` exited with {result.returncode}{detail}")
    return result
