"""The Artifact Registry cleanup policy of the cluster image repositories.

Each region's docker repository `marin` gets the same policy: delete images older than
`MAX_AGE_DAYS` (30) days, but always keep the `KEEP_MOST_RECENT` (16) most recent ones, so a
region that has not been pushed to for a month still has the images its clusters run.

The policy document is generated (`marin cluster update-configs`) into
`infra/artifact-registry-cleanup-policy.json` and committed, like the cluster configs: the
exact file gcloud sends is reviewable, and a test fails when it drifts from `cleanup_policy()`.
Its format is Artifact Registry's policy file (a JSON list of named policies, each with an
`action.type` of `Delete` or `Keep` and either a `condition` or `mostRecentVersions`), as
`gcloud artifacts repositories set-cleanup-policies --policy=FILE` reads it.

`infra/configure_gcp_registry.py <repository> --region=R [--project=P]` is `main()`.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Sequence
from pathlib import Path

from marin.cluster.commands import gcloud_set_cleanup_policies, run_command
from marin.cluster.config import infra_dir

__all__ = [
    "KEEP_MOST_RECENT",
    "MAX_AGE_DAYS",
    "POLICY_FILE",
    "check_policy_file",
    "cleanup_policy",
    "configure_registry",
    "main",
    "policy_path",
    "write_policy_file",
]

MAX_AGE_DAYS = 30
KEEP_MOST_RECENT = 16
POLICY_FILE = "artifact-registry-cleanup-policy.json"


def cleanup_policy(max_age_days: int = MAX_AGE_DAYS, keep: int = KEEP_MOST_RECENT) -> list[dict]:
    """The policy list: one delete rule by age, one keep rule by recency (keep wins on overlap)."""
    if max_age_days < 1 or keep < 1:
        raise ValueError(f"max_age_days and keep must be positive, got {max_age_days} and {keep}")
    return [
        {
            "name": f"delete-older-than-{max_age_days}d",
            "action": {"type": "Delete"},
            "condition": {"tagState": "any", "olderThan": f"{max_age_days}d"},
        },
        {
            "name": f"keep-{keep}-most-recent",
            "action": {"type": "Keep"},
            "mostRecentVersions": {"keepCount": keep},
        },
    ]


def _policy_text() -> str:
    return json.dumps(cleanup_policy(), indent=2) + "\n"


def policy_path(directory: Path | None = None) -> Path:
    return (directory or infra_dir()) / POLICY_FILE


def write_policy_file(directory: Path | None = None) -> Path:
    path = policy_path(directory)
    path.write_text(_policy_text())
    return path


def check_policy_file(directory: Path | None = None) -> list[str]:
    """`[POLICY_FILE]` when the committed file is missing or differs from `cleanup_policy()`."""
    path = policy_path(directory)
    return [] if path.is_file() and path.read_text() == _policy_text() else [path.name]


def configure_registry(repository: str, region: str, project: str | None, *, dry_run: bool) -> None:
    """Set the cleanup policy on `repository` in `region` (gcloud's project when `project` is None)."""
    if check_policy_file():
        raise FileNotFoundError(f"{policy_path()} is missing or stale; run `marin cluster update-configs`")
    path = policy_path()
    try:
        path = path.relative_to(Path.cwd())
    except ValueError:
        pass
    run_command(gcloud_set_cleanup_policies(repository, region, project, path), dry_run=dry_run)
    if not dry_run:
        where = f"{region}/{repository}" + (f" in {project}" if project else "")
        print(f"Cleanup policy set on {where}: delete after {MAX_AGE_DAYS} days, keep the {KEEP_MOST_RECENT} newest.")


def main(argv: Sequence[str] | None = None, prog: str = "infra/configure_gcp_registry.py") -> int:
    parser = argparse.ArgumentParser(
        prog=prog,
        description=(
            f"Set the cleanup policy of an Artifact Registry repository: delete images older than "
            f"{MAX_AGE_DAYS} days, always keep the {KEEP_MOST_RECENT} most recent."
        ),
        epilog=f"Example: {prog} marin --region=us-central2 --dry-run   (make configure_gcp_registry_all: every region)",
    )
    parser.add_argument("repository", help="Artifact Registry repository name (ours: marin).")
    parser.add_argument("--region", required=True, help="Its region (location), e.g. us-central2.")
    parser.add_argument("--project", default=None, help="GCP project (default: gcloud's configured project).")
    parser.add_argument("--dry-run", action="store_true", help="Print the gcloud command instead of running it.")
    args = parser.parse_args(argv)
    try:
        configure_registry(args.repository, args.region, args.project, dry_run=args.dry_run)
    except (FileNotFoundError, RuntimeError) as e:
        print(f"{prog}: error: {e}", file=sys.stderr)
        return 2
    return 0
