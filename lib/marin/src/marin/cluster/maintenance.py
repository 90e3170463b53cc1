"""`marin cluster` maintenance commands: the image, the registry policy, the ssh key, the token
secret and preempted TPU VMs. Each parses its options and calls `image`, `registry` or
`housekeeping`; the Makefile targets call these commands.

    marin cluster [--dry-run] build-image [--region R ...] [--project P] [--no-push] [--allow-dirty]  # make cluster_docker
    marin cluster [--dry-run] install-ssh-key [--project P]                              # make dev_setup
    marin cluster --cluster NAME [--dry-run] init-auth-secret                          # make init_ray_auth_token_secret
    marin cluster --cluster NAME [--dry-run] clean-preempted-tpus [--yes]
"""

from __future__ import annotations

import argparse
from collections.abc import Callable

from marin.cluster import housekeeping, image
from marin.cluster.config import DEFAULT_PROJECT
from marin.cluster.target import Target

__all__ = ["NO_TARGET", "register"]

NO_TARGET = frozenset({"build-image", "install-ssh-key"})


def _cloud_spec(target: Target, command: str):
    if target.spec is None:
        raise ValueError(f"`{command}` is for cloud clusters; the local cluster has no Secret Manager or TPU VMs")
    return target.spec


def cmd_build_image(target: Target | None, args: argparse.Namespace) -> int:
    plan = image.plan_image(args.region, args.project, image.utc_now(), allow_dirty=args.allow_dirty)
    image.build_and_push(plan, dry_run=args.dry_run, push=args.push)
    return 0


def cmd_install_ssh_key(target: Target | None, args: argparse.Namespace) -> int:
    housekeeping.install_ssh_key(args.project, dry_run=args.dry_run)
    return 0


def cmd_init_auth_secret(target: Target, args: argparse.Namespace) -> int:
    spec = _cloud_spec(target, "init-auth-secret")
    housekeeping.init_auth_secret(spec, target.token_path, dry_run=args.dry_run)
    return 0


def cmd_clean_preempted_tpus(target: Target, args: argparse.Namespace) -> int:
    spec = _cloud_spec(target, "clean-preempted-tpus")
    housekeeping.clean_preempted_tpus(spec, dry_run=args.dry_run, yes=args.yes)
    return 0


def register(add: Callable[[str, Callable, str], argparse.ArgumentParser]) -> None:
    """Add the maintenance subcommands through `cli.build_parser`'s `add(name, func, help)`."""
    project_help = f"GCP project (default {DEFAULT_PROJECT})."
    p = add(
        "build-image",
        cmd_build_image,
        "Build docker/marin/Dockerfile.cluster, push it (tags: latest, COMMIT, YYYYMMDD-COMMIT) to every region, "
        "record YYYYMMDD-COMMIT as LATEST_DOCKER_TAG (only when every region of the cluster table got it).",
    )
    p.add_argument(
        "--region",
        action="append",
        metavar="REGION",
        help="Region to push to; repeat for several (default: every region of the cluster table). "
        "A subset is pushed but not recorded as LATEST_DOCKER_TAG.",
    )
    p.add_argument("--project", default=DEFAULT_PROJECT, help=project_help)
    p.add_argument("--no-push", dest="push", action="store_false", help="Build and tag only.")
    p.add_argument(
        "--allow-dirty",
        action="store_true",
        help="Build from a work tree with uncommitted changes (refused otherwise); the tags get a -dirty suffix.",
    )
    p = add("install-ssh-key", cmd_install_ssh_key, "Install the cluster ssh key pair from Secret Manager into ~/.ssh.")
    p.add_argument("--project", default=DEFAULT_PROJECT, help=project_help)
    add(
        "init-auth-secret",
        cmd_init_auth_secret,
        "Create the cluster's Ray token secret once from a new token (refuses if it exists) and let the "
        "cluster's service account read it.",
    )
    p = add(
        "clean-preempted-tpus",
        cmd_clean_preempted_tpus,
        "List the cluster's dead TPU VMs (state PREEMPTED or TERMINATED), which Ray's autoscaler never deletes; "
        "delete them with --yes. Hygiene only: when the autoscaler is stuck, restart-cluster.",
    )
    p.add_argument(
        "--yes",
        action="store_true",
        help="Delete them (default: only print what would be deleted); every delete is tried, failures exit 2.",
    )
