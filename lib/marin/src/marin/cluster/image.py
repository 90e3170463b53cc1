"""The cluster image: build `docker/marin/Dockerfile.cluster`, push it to every region, record its tag.

`make cluster_docker` runs `marin cluster build-image`, which

1. builds the image once (`docker build`, linux/amd64) as `marin_cluster:latest`;
2. tags it `latest`, the short git commit and the UTC date (`YYYYMMDD`) for each region:
   `<region>-docker.pkg.dev/<project>/marin/marin_cluster:<tag>`;
3. per region, lets docker authenticate (`gcloud auth configure-docker`) and creates the
   Artifact Registry repository `marin` when it does not exist;
4. pushes every tag to every region;
5. rewrites `LATEST_DOCKER_TAG` in `marin/cluster/config.py` to the date tag: the one place
   `marin cluster update-configs` reads the tag from.

Every external command is built in `commands.py`; with `dry_run` they are printed, not run.
"""

from __future__ import annotations

import datetime as dt
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from marin.cluster import config
from marin.cluster.commands import (
    docker_build,
    docker_daemon_check,
    docker_push,
    docker_tag,
    format_command,
    gcloud_configure_docker,
    gcloud_create_repository,
    gcloud_describe_repository,
    git_short_commit,
    git_status,
    require_tools,
    run_command,
)

__all__ = [
    "DOCKERFILE",
    "ImagePlan",
    "build_and_push",
    "default_regions",
    "ensure_repository",
    "image_tags",
    "plan_image",
    "record_latest_tag",
]

DOCKERFILE = Path("docker") / "marin" / "Dockerfile.cluster"
LOCAL_IMAGE = f"{config.IMAGE_NAME}:latest"
_TAG_LINE = re.compile(r'^LATEST_DOCKER_TAG = "[^"\n]*"$', re.MULTILINE)
_VALID_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")


def default_regions() -> list[str]:
    """Every region with a cluster in the table, in table order."""
    return list(dict.fromkeys(spec.region for spec in config.CLUSTERS.values()))


def image_tags(commit: str, now: dt.datetime) -> list[str]:
    """`latest`, the short commit and the UTC date; the date tag (last) is the one clusters pin."""
    return ["latest", commit, now.astimezone(dt.timezone.utc).strftime("%Y%m%d")]


@dataclass(frozen=True)
class ImagePlan:
    """What one `build-image` run builds and where it pushes it."""

    root: Path  # the build context: the repository root
    regions: tuple[str, ...]
    project: str
    tags: tuple[str, ...]

    @property
    def dockerfile(self) -> Path:
        return self.root / DOCKERFILE

    @property
    def pinned_tag(self) -> str:
        return self.tags[-1]

    def refs(self, region: str) -> list[str]:
        return [config.image_ref(region, tag, self.project) for tag in self.tags]


def _relative(path: Path) -> Path:
    try:
        return path.relative_to(Path.cwd())
    except ValueError:
        return path


def plan_image(regions: list[str] | None, project: str, now: dt.datetime | None = None) -> ImagePlan:
    """The plan for this checkout: reads the short commit with git (local, read-only)."""
    require_tools("git", purpose="Tagging the image with the commit")
    root = _relative(config.infra_dir().parent)
    commit = run_command(git_short_commit(root), dry_run=False, capture=True, quiet=True).stdout.strip()
    if run_command(git_status(root), dry_run=False, capture=True, quiet=True).stdout.strip():
        print(f"warning: the work tree has uncommitted changes; tag {commit} will not describe them", file=sys.stderr)
    regions = list(dict.fromkeys(regions or default_regions()))
    for region in regions:
        if not re.fullmatch(r"[a-z]+-[a-z]+\d", region):
            raise ValueError(f"{region!r} is not a GCP region (e.g. us-central2, europe-west4)")
    return ImagePlan(root, tuple(regions), project, tuple(image_tags(commit, now or dt.datetime.now(dt.timezone.utc))))


def _not_found(stderr: str) -> bool:
    return "NOT_FOUND" in stderr or "not found" in stderr.lower()


def ensure_repository(region: str, project: str, *, dry_run: bool) -> None:
    """Create the region's docker repository `marin` unless it exists (any other error is raised)."""
    describe = gcloud_describe_repository(config.IMAGE_REPOSITORY, region, project)
    create = gcloud_create_repository(config.IMAGE_REPOSITORY, region, project)
    if dry_run:
        print(format_command(describe))
        print(f"# only if it does not exist:\n{format_command(create)}")
        return
    result = run_command(describe, dry_run=False, capture=True, check=False)
    if result.returncode == 0:
        return
    if not _not_found(result.stderr):
        raise RuntimeError(f"Could not look up repository {config.IMAGE_REPOSITORY} in {region}: {result.stderr.strip()}")
    run_command(create, dry_run=False)


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
    """Build, tag, push to every region and record the tag in `config_file` (default: config.py)."""
    if not dry_run:
        require_tools("docker", *(["gcloud"] if push else []), purpose="Building and pushing the cluster image")
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
    config_file = _relative(config_file or Path(config.__file__))
    if dry_run:
        print(f'# then set LATEST_DOCKER_TAG = "{plan.pinned_tag}" in {config_file}')
        return
    record_latest_tag(plan.pinned_tag, config_file)
    print(f"Pushed {config.IMAGE_NAME}:{{{','.join(plan.tags)}}} to {', '.join(plan.regions)}.")
    print(f'Recorded LATEST_DOCKER_TAG = "{plan.pinned_tag}" in {config_file}. Next:')
    print("  uv run marin cluster update-configs   # write the tag into infra/marin-*.yaml")
    print("  uv run marin cluster --cluster us-central2-staging restart-cluster   # try it on staging first")
    print("  then commit, and restart the other clusters")
