"""The cluster image: build `docker/marin/Dockerfile.cluster`, push it to every region, record its tag.

`make cluster_docker` runs `marin cluster build-image`, which

1. refuses a work tree with uncommitted changes (unless `allow_dirty`: the tags then say `-dirty`);
2. builds the image once (`docker build --pull`, linux/amd64) as `marin_cluster:latest`;
3. tags it `latest`, the short git commit and `YYYYMMDD-<commit>` (UTC date) for each region:
   `<region>-docker.pkg.dev/<project>/marin/marin_cluster:<tag>`; the last one names this build
   alone (a second build the same day has another commit), so it is the one clusters pin;
4. per region, lets docker authenticate (`gcloud auth configure-docker`) and creates the
   Artifact Registry repository `marin` when it does not exist, with the cleanup policy;
5. pushes every tag to every region;
6. rewrites `LATEST_DOCKER_TAG` in `marin/cluster/config.py` to the pinned tag, the one place
   `marin cluster update-configs` reads it from, but only when the image went to every region
   of the cluster table: that tag is written into every cluster's config.

Every external command is built in `commands.py`; with `dry_run` they are printed, not run.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
from dataclasses import dataclass
from pathlib import Path

from marin.cluster import config, registry
from marin.cluster.commands import (
    docker_build,
    docker_daemon_check,
    docker_push,
    docker_tag,
    format_command,
    gcloud_configure_docker,
    gcloud_create_repository,
    gcloud_describe_repository,
    gcloud_not_found,
    git_short_commit,
    git_status,
    require_tools,
    run_command,
)

__all__ = [
    "DOCKERFILE",
    "DirtyTreeError",
    "ImagePlan",
    "build_and_push",
    "default_regions",
    "ensure_repository",
    "image_tags",
    "plan_image",
    "record_latest_tag",
    "utc_now",
]

DOCKERFILE = Path("docker") / "marin" / "Dockerfile.cluster"
LOCAL_IMAGE = f"{config.IMAGE_NAME}:latest"
_TAG_LINE = re.compile(r'^LATEST_DOCKER_TAG = "[^"\n]*"$', re.MULTILINE)
_VALID_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def default_regions() -> list[str]:
    """Every region with a cluster in the table, in table order."""
    return list(dict.fromkeys(spec.region for spec in config.CLUSTERS.values()))


def utc_now() -> dt.datetime:
    """The build's clock (tests replace it)."""
    return dt.datetime.now(dt.timezone.utc)


def image_tags(commit: str, now: dt.datetime, *, dirty: bool = False) -> list[str]:
    """`latest`, the commit and `YYYYMMDD-<commit>` (UTC date); the last is the one clusters pin.

    A build from a dirty work tree is not what the commit describes: its tags say `-dirty`, so it
    never replaces the image of the clean commit.
    """
    commit = f"{commit}-dirty" if dirty else commit
    return ["latest", commit, f"{now.astimezone(dt.timezone.utc):%Y%m%d}-{commit}"]


class DirtyTreeError(RuntimeError):
    """The checkout has uncommitted changes, so no commit describes the image it would build."""


@dataclass(frozen=True)
class ImagePlan:
    """What one `build-image` run builds and where it pushes it."""

    root: Path  # the build context: the repository root
    regions: tuple[str, ...]
    project: str
    tags: tuple[str, ...]
    commit: str = ""
    changes: tuple[str, ...] = ()  # uncommitted changes (`git status --porcelain` lines)
    allow_dirty: bool = False

    @property
    def dockerfile(self) -> Path:
        return self.root / DOCKERFILE

    @property
    def pinned_tag(self) -> str:
        return self.tags[-1]

    @property
    def missing_regions(self) -> list[str]:
        """Regions of the cluster table this plan does not push to."""
        return [region for region in default_regions() if region not in self.regions]

    @property
    def records_tag(self) -> bool:
        """Whether the pinned tag may become LATEST_DOCKER_TAG, which every cluster's config uses."""
        return not self.missing_regions

    def refs(self, region: str) -> list[str]:
        return [config.image_ref(region, tag, self.project) for tag in self.tags]


def _relative(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def _git(argv: list[str]) -> str:
    return run_command(argv, dry_run=False, capture=True, quiet=True).stdout.strip()


def plan_image(
    regions: list[str] | None,
    project: str,
    now: dt.datetime | None = None,
    *,
    allow_dirty: bool = False,
) -> ImagePlan:
    """The plan for this checkout (git is only read; `build_and_push` refuses uncommitted changes)."""
    require_tools("git", purpose="Tagging the image with the commit")
    root = _relative(config.infra_dir().parent)
    commit = _git(git_short_commit(root))
    changes = tuple(_git(git_status(root)).splitlines())
    regions = list(dict.fromkeys(regions or default_regions()))
    for region in regions:
        if not re.fullmatch(r"[a-z]+-[a-z]+\d", region):
            raise ValueError(f"{region!r} is not a GCP region (e.g. us-central2, europe-west4)")
    tags = image_tags(commit, now or utc_now(), dirty=bool(changes))
    return ImagePlan(root, tuple(regions), project, tuple(tags), commit, changes, allow_dirty)


def _refuse_dirty(plan: ImagePlan) -> None:
    if plan.changes and not plan.allow_dirty:
        raise DirtyTreeError(
            f"The work tree has {len(plan.changes)} uncommitted change(s) (e.g. {plan.changes[0].strip()}), so "
            f"the image would not be what commit {plan.commit} describes. Commit them, or pass --allow-dirty "
            f"(tags {plan.commit}-dirty, never taken for the clean commit's image)."
        )


def ensure_repository(region: str, project: str, *, dry_run: bool) -> None:
    """Create the region's docker repository `marin` unless it exists (any other error is raised).

    A repository this creates gets the cleanup policy at once (`registry.configure_registry`).
    """
    describe = gcloud_describe_repository(config.IMAGE_REPOSITORY, region, project)
    create = gcloud_create_repository(config.IMAGE_REPOSITORY, region, project)
    if dry_run:
        print(format_command(describe))
        print("# only if it does not exist:")
        print(format_command(create))
        registry.configure_registry(config.IMAGE_REPOSITORY, region, project, dry_run=True)
        return
    result = run_command(describe, dry_run=False, capture=True, check=False)
    if result.returncode == 0:
        return
    if not gcloud_not_found(result.stderr):
        detail = result.stderr.strip()
        raise RuntimeError(f"Could not look up repository {config.IMAGE_REPOSITORY} in {region}: {detail}")
    run_command(create, dry_run=False)
    registry.configure_registry(config.IMAGE_REPOSITORY, region, project, dry_run=False)


def record_latest_tag(tag: str, path: Path | None = None) -> Path:
    """Rewrite the `LATEST_DOCKER_TAG = "..."` line of `config.py` (atomically) to `tag`."""
    if not _VALID_TAG.match(tag):
        raise ValueError(f"{tag!r} is not a valid docker tag")
    path = path or Path(config.__file__)
    text = path.read_text()
    if len(_TAG_LINE.findall(text)) != 1:
        raise ValueError(f"Expected exactly one `LATEST_DOCKER_TAG = \"...\"` line in {path}")
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(_TAG_LINE.sub(f'LATEST_DOCKER_TAG = "{tag}"', text))
    tmp.replace(path)
    return path


def _check_docker_daemon() -> None:
    result = subprocess.run(docker_daemon_check(), capture_output=True, text=True)
    if result.returncode != 0:
        raise RuntimeError(f"docker is installed but cannot reach its daemon: {result.stderr.strip()[-500:]}")


def build_and_push(plan: ImagePlan, *, dry_run: bool, push: bool = True, config_file: Path | None = None) -> None:
    """Build, tag, push to every region and record the tag in `config_file` (default: config.py).

    Refuses (DirtyTreeError, dry run too) uncommitted changes unless the plan allows them. The tag
    is recorded only when `plan` covers every region of the cluster table.
    """
    if push and registry.check_policy_file():  # new repositories get it: fail before building
        raise FileNotFoundError(f"{registry.policy_path()} is missing or stale; run `marin cluster update-configs`")
    if not dry_run:
        require_tools("docker", *(["gcloud"] if push else []), purpose="Building and pushing the cluster image")
    _refuse_dirty(plan)
    if not dry_run:
        _check_docker_daemon()
    run_command(docker_build(plan.dockerfile, LOCAL_IMAGE, plan.root), dry_run=dry_run)
    for region in plan.regions:
        for ref in plan.refs(region):
            run_command(docker_tag(LOCAL_IMAGE, ref), dry_run=dry_run)
    if not push:
        return
    for region in plan.regions:
        run_command(gcloud_configure_docker(region), dry_run=dry_run)
        ensure_repository(region, plan.project, dry_run=dry_run)
        for ref in plan.refs(region):
            run_command(docker_push(ref), dry_run=dry_run)
    _record(plan, _relative(config_file or Path(config.__file__)), dry_run=dry_run)


def _record(plan: ImagePlan, config_file: Path, *, dry_run: bool) -> None:
    tag = plan.pinned_tag
    if not plan.records_tag:
        print(
            f"# LATEST_DOCKER_TAG not changed: every cluster's config uses it, and {', '.join(plan.missing_regions)} "
            f"did not get {tag}. Push to every region (make cluster_docker) to roll it out, or pin one cluster "
            f'in a pushed region to it with docker_tag="{tag}" on its row of {config_file}.'
        )
        return
    if dry_run:
        print(f'# then set LATEST_DOCKER_TAG = "{tag}" in {config_file}')
        return
    record_latest_tag(tag, config_file)
    print(f"Pushed {config.IMAGE_NAME}:{{{','.join(plan.tags)}}} to {', '.join(plan.regions)}.")
    print(f'Recorded LATEST_DOCKER_TAG = "{tag}" in {config_file}. Next:')
    print("  uv run marin cluster update-configs   # write the tag into infra/marin-*.yaml")
    print("  uv run marin cluster --cluster us-central2-staging restart-cluster   # try it on staging first")
    print("  then commit, and restart the other clusters")
