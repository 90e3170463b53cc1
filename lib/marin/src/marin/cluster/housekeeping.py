"""One-time setup and cleanup around the cloud clusters: ssh key, token secret, preempted TPU VMs.

- `install_ssh_key`: the cluster ssh key pair from Secret Manager into `~/.ssh` (`make dev_setup`).
- `init_auth_secret`: create a cluster's Ray token secret once, from a freshly generated
  token, refusing to touch one that exists, and let the cluster's service account read it
  (`make init_ray_auth_token_secret`).
- `clean_preempted_tpus`: delete the dead (PREEMPTED or TERMINATED) TPU VMs of a cluster, a
  hygiene step. Ray's GCP provider lists only TPU VMs in CREATING, STARTING, RESTARTING or READY
  state (`GCPTPUNode.NON_TERMINATED_STATUSES` in `ray/autoscaler/_private/gcp/node.py`), so it
  counts a preempted spot VM as terminated and never deletes it: it stays in the zone, labelled
  with the cluster's name, until someone removes it. A VM that a queued resource holds (what
  `add-worker --capacity best-effort` creates) is deleted through its queued resource.

Secrets only travel through files and captured stdout, never argv or our output.
"""

from __future__ import annotations

import json
import re
import shutil
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from marin.cluster import local
from marin.cluster.auth import write_private_file
from marin.cluster.commands import (
    SSH_KEY,
    format_command,
    gcloud_create_secret,
    gcloud_delete_queued_resource,
    gcloud_delete_tpu,
    gcloud_describe_secret,
    gcloud_fetch_secret,
    gcloud_grant_secret_access,
    gcloud_list_tpus,
    gcloud_not_found,
    local_generate_token,
    require_tools,
    run_command,
)
from marin.cluster.config import ClusterSpec

__all__ = [
    "DEAD_STATES",
    "SSH_PRIVATE_KEY_SECRET",
    "SSH_PUBLIC_KEY_SECRET",
    "TpuVm",
    "clean_preempted_tpus",
    "delete_command",
    "grant_secret_access",
    "init_auth_secret",
    "install_ssh_key",
    "preempted_tpus",
]

# Secret Manager secrets holding the key pair Ray's launcher uses (`auth.ssh_private_key`).
SSH_PRIVATE_KEY_SECRET = "RAY_CLUSTER_PRIVATE_KEY"
SSH_PUBLIC_KEY_SECRET = "RAY_CLUSTER_PUBLIC_KEY"
# States of a spot TPU VM that will never run again; deleting is the only thing left to do.
DEAD_STATES = frozenset({"PREEMPTED", "TERMINATED"})
RAY_CLUSTER_LABEL = "ray-cluster-name"  # set by Ray's GCP provider on every VM it launches


def _ssh_key_paths() -> dict[str, Path]:
    private = Path(SSH_KEY).expanduser()
    return {SSH_PRIVATE_KEY_SECRET: private, SSH_PUBLIC_KEY_SECRET: private.with_suffix(".pub")}


def install_ssh_key(project: str, *, dry_run: bool) -> list[Path]:
    """Fetch the cluster key pair into `~/.ssh` (private key mode 600); an existing file is kept."""
    installed = []
    for secret, path in _ssh_key_paths().items():
        argv = gcloud_fetch_secret(secret, project)
        if path.exists():
            print(f"{path} exists; kept (delete it to reinstall)")
            continue
        if dry_run:
            print(f"{format_command(argv)} > {path}")
            continue
        value = run_command(argv, dry_run=False, capture=True).stdout
        if not value.strip():
            raise RuntimeError(f"Secret {secret} in {project} is empty")
        write_private_file(path, value if value.endswith("\n") else value + "\n")
        if secret == SSH_PUBLIC_KEY_SECRET:
            path.chmod(0o644)
        installed.append(path)
        print(f"Installed {path}")
    return installed


def _secret_exists(secret: str, project: str) -> bool:
    result = run_command(gcloud_describe_secret(secret, project), dry_run=False, capture=True, check=False)
    if result.returncode == 0:
        return True
    if gcloud_not_found(result.stderr):
        return False
    raise RuntimeError(f"Could not look up secret {secret} in {project}: {result.stderr.strip()[-1000:]}")


def init_auth_secret(spec: ClusterSpec, token_path: Path, *, dry_run: bool) -> None:
    """Create `spec.auth_secret` from a new Ray token, let the cluster read it, install it at `token_path`.

    Refuses when the secret exists: every node of the cluster and every user reads it, and a
    silent overwrite would lock them all out. Rotating a token is a deliberate, separate act.
    """
    secret, project = spec.auth_secret, spec.project
    grant = gcloud_grant_secret_access(secret, project, spec.service_account)
    scratch = Path(tempfile.gettempdir()) / "marin-token-XXXXXX"
    generated = local.token_path(scratch)
    if dry_run:
        print(format_command(gcloud_describe_secret(secret, project)))
        print(f"# only if {secret} does not exist (otherwise: refuse):")
        print(f"HOME={scratch / 'home'} {format_command(local_generate_token())} > /dev/null")
        print(format_command(gcloud_create_secret(secret, project, generated)))
        print(format_command(grant))
        print(f"# then install the new token at {token_path} (mode 600) and remove {scratch}")
        return
    require_tools("gcloud", purpose=f"Creating the {secret} secret")
    if _secret_exists(secret, project):
        raise RuntimeError(
            f"Secret {secret} already exists in {project}; refusing to overwrite it (every node and user of "
            f"{spec.cluster_name} reads it). Install it with `marin cluster --cluster {spec.name} auth`; to rotate "
            f"it on purpose, add a version (`gcloud secrets versions add {secret} --data-file=FILE`) and restart "
            f"the cluster. If the cluster's nodes cannot read it: {format_command(grant)}"
        )
    scratch = Path(tempfile.mkdtemp(prefix="marin-token-"))
    try:
        generated = local.ensure_token(scratch)  # `ray get-auth-token --generate`, stdout discarded
        run_command(gcloud_create_secret(secret, project, generated), dry_run=False)
        write_private_file(token_path, generated.read_text())
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"Created secret {secret} in {project} from a new token (never printed); installed it at {token_path}.")
    grant_secret_access(spec)


def grant_secret_access(spec: ClusterSpec) -> None:
    """Give the cluster's service account `roles/secretmanager.secretAccessor` on its token secret.

    Its nodes read the token in `setup_commands`; without the role they cannot start Ray. When the
    caller may not change the secret's policy, the error names the exact command for someone who can.
    """
    grant = gcloud_grant_secret_access(spec.auth_secret, spec.project, spec.service_account)
    result = run_command(grant, dry_run=False, capture=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(
            f"Could not let {spec.service_account} read {spec.auth_secret} ({result.stderr.strip()[-500:]}). "
            f"The cluster's nodes need it to start; ask a project owner to run:\n  {format_command(grant)}"
        )
    print(f"Granted roles/secretmanager.secretAccessor on {spec.auth_secret} to {spec.service_account}.")


@dataclass(frozen=True)
class TpuVm:
    """A TPU VM as `gcloud compute tpus tpu-vm list --format=json` reports it."""

    name: str
    state: str
    accelerator_type: str
    created: str
    queued_resource: str | None = None  # the queued resource holding it (short name), if any


def _short_name(node: dict) -> str:
    return str(node.get("name", "")).rsplit("/", 1)[-1]


def _belongs_to(node: dict, spec: ClusterSpec) -> bool:
    """Launched by the cluster's autoscaler (label), or by `add-worker` under its default name."""
    labels = node.get("labels") or {}
    if labels.get(RAY_CLUSTER_LABEL) == spec.cluster_name:
        return True
    # add-worker names VMs ray-worker-<cluster>-<tpu type>-<hex>; TPU types start with v<digit>.
    return re.match(rf"ray-worker-{re.escape(spec.name)}-v\d", _short_name(node)) is not None


def _tpu_vm(node: dict) -> TpuVm:
    queued = str(node.get("queuedResource") or "").rsplit("/", 1)[-1] or None
    return TpuVm(_short_name(node), node["state"], node.get("acceleratorType", "?"), node.get("createTime", "?"), queued)


def preempted_tpus(nodes: list[dict], spec: ClusterSpec) -> list[TpuVm]:
    """The TPU VMs of `spec`'s cluster in a dead state (PREEMPTED or TERMINATED), by name."""
    found = [_tpu_vm(node) for node in nodes if node.get("state") in DEAD_STATES and _belongs_to(node, spec)]
    return sorted(found, key=lambda vm: vm.name)


def delete_command(vm: TpuVm, spec: ClusterSpec) -> list[str]:
    """How to delete `vm`: through its queued resource when one holds it (gcloud refuses otherwise)."""
    if vm.queued_resource:
        return gcloud_delete_queued_resource(vm.queued_resource, spec.zone, spec.project)
    return gcloud_delete_tpu(vm.name, spec.zone, spec.project)


def _list_tpus(spec: ClusterSpec) -> list[dict]:
    out = run_command(gcloud_list_tpus(spec.zone, spec.project), dry_run=False, capture=True).stdout
    try:
        nodes = json.loads(out or "[]")
    except json.JSONDecodeError as e:
        raise RuntimeError(f"`gcloud compute tpus tpu-vm list` did not print JSON: {e}") from None
    if not isinstance(nodes, list):
        raise RuntimeError("`gcloud compute tpus tpu-vm list --format=json` did not print a list")
    return nodes


def clean_preempted_tpus(spec: ClusterSpec, *, dry_run: bool, yes: bool) -> list[TpuVm]:
    """List the cluster's dead TPU VMs; delete them only with `yes` (otherwise print the commands).

    Every delete is tried; when any fails, a RuntimeError naming them is raised at the end.
    """
    states = " or ".join(sorted(DEAD_STATES))
    if dry_run:
        print(format_command(gcloud_list_tpus(spec.zone, spec.project)))
        print(f"# for each TPU VM in state {states} labelled {RAY_CLUSTER_LABEL}={spec.cluster_name}")
        print(f"# (or named ray-worker-{spec.name}-v...; with --yes only):")
        print(format_command(gcloud_delete_tpu("<name>", spec.zone, spec.project)))
        print("# or, for a VM that a queued resource holds (its queuedResource field):")
        print(format_command(gcloud_delete_queued_resource("<queued-resource>", spec.zone, spec.project)))
        return []
    dead = preempted_tpus(_list_tpus(spec), spec)
    if not dead:
        print(f"No {states} TPU VMs of {spec.cluster_name} in {spec.zone}.")
        return []
    print(f"# {len(dead)} TPU VM(s) of {spec.cluster_name} in state {states} (both are dead for good):")
    for vm in dead:
        held = f" queued resource {vm.queued_resource}" if vm.queued_resource else ""
        print(f"#   {vm.name:<48} {vm.accelerator_type:<12} {vm.state:<11} created {vm.created}{held}")
    # one delete per VM, or per queued resource (which may hold several)
    deletes = {tuple(delete_command(vm, spec)): vm.queued_resource or vm.name for vm in dead}
    failed = []
    for argv, what in deletes.items():
        result = run_command(argv, dry_run=not yes, check=False)
        if result is not None and result.returncode != 0:
            failed.append(f"{what} (exit {result.returncode})")
    if not yes:
        print("# nothing deleted: rerun with --yes to run the commands above", file=sys.stderr)
    if failed:
        raise RuntimeError(f"{len(failed)} of {len(deletes)} delete(s) failed: {', '.join(failed)}; the others ran")
    return dead
