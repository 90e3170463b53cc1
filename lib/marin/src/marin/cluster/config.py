"""The table of Marin clusters and the generation of their Ray launcher configs.

Every cloud cluster is one row of `CLUSTERS`. `infra/marin-cluster-template.yaml` (Jinja2)
turns a row into a Ray cluster launcher config; `write_configs()` writes one
`infra/marin-<name>.yaml` per row with a "generated, do not edit" banner. The generated files
are committed, and a test fails when they differ from what the template produces.

The `local` cluster is not in the table: it is a Ray head on this machine (see `local.py`).
"""

from __future__ import annotations

import enum
import os
from dataclasses import dataclass
from pathlib import Path

import yaml

__all__ = [
    "CLUSTERS",
    "DEFAULT_PROJECT",
    "IMAGE_NAME",
    "IMAGE_REPOSITORY",
    "LATEST_DOCKER_TAG",
    "LOCAL_CLUSTER",
    "TEMPLATE_NAME",
    "Capacity",
    "ClusterSpec",
    "check_configs",
    "cluster_from_config_file",
    "config_path",
    "get_cluster",
    "image_ref",
    "infra_dir",
    "render_config",
    "write_configs",
]

LOCAL_CLUSTER = "local"
DEFAULT_PROJECT = "hai-gcp-models"
IMAGE_REPOSITORY = "marin"  # the Artifact Registry repository, one per region
IMAGE_NAME = "marin_cluster"
# `make cluster_docker` (`marin cluster build-image`) rewrites this line after pushing a new image to
# every region; `update-configs` then writes it into every generated config. Keep it on one line.
LATEST_DOCKER_TAG = "20261120"
TEMPLATE_NAME = "marin-cluster-template.yaml"
BANNER = (
    "# GENERATED FILE, DO NOT EDIT.\n"
    "# Source: infra/{template} rendered for cluster '{name}' (lib/marin/src/marin/cluster/config.py).\n"
    "# Edit the template or the cluster table, then run `marin cluster update-configs`.\n"
)


def image_ref(region: str, tag: str, project: str = DEFAULT_PROJECT) -> str:
    """Where the cluster image with `tag` lives in `region`'s Artifact Registry."""
    return f"{region}-docker.pkg.dev/{project}/{IMAGE_REPOSITORY}/{IMAGE_NAME}:{tag}"


class Capacity(enum.StrEnum):
    """How a TPU VM is bought: preemptible (autoscaled), best-effort (spot), reserved."""

    PREEMPTIBLE = "preemptible"
    BEST_EFFORT = "best-effort"
    RESERVED = "reserved"


# Runtime image of the TPU VM for each TPU generation.
_TPU_RUNTIME = {
    "v4": "tpu-ubuntu2204-base",
    "v5e": "v2-alpha-tpuv5-lite",
    "v6e": "v2-alpha-tpuv6e",
}


@dataclass(frozen=True)
class ClusterSpec:
    """One Marin cloud cluster: where it lives, its TPU workers, its bucket and image."""

    name: str
    region: str
    zone: str
    tpu_generation: str
    worker_tpu_type: str
    bucket: str
    docker_tag: str = LATEST_DOCKER_TAG
    capacity: Capacity = Capacity.PREEMPTIBLE
    min_workers: int = 4
    max_workers: int = 1024
    worker_cpus: int = 120
    project: str = DEFAULT_PROJECT
    auth_secret: str = "RAY_AUTH_TOKEN"

    def __post_init__(self) -> None:
        if self.tpu_generation not in _TPU_RUNTIME:
            raise ValueError(
                f"Unknown TPU generation {self.tpu_generation!r} for cluster {self.name!r}; "
                f"expected one of {sorted(_TPU_RUNTIME)}"
            )
        if not 0 <= self.min_workers <= self.max_workers:
            raise ValueError(
                f"Cluster {self.name!r}: need 0 <= min_workers <= max_workers, "
                f"got {self.min_workers} and {self.max_workers}"
            )

    @property
    def cluster_name(self) -> str:
        """The Ray `cluster_name`; Ray identifies running clusters by it, so never rename one that is up."""
        return f"marin-{self.name}"

    @property
    def docker_image(self) -> str:
        return image_ref(self.region, self.docker_tag, self.project)

    @property
    def service_account(self) -> str:
        """The service account every node of the cluster runs as (it reads the token secret)."""
        return f"marin-ray@{self.project}.iam.gserviceaccount.com"

    @property
    def runtime_version(self) -> str:
        return _TPU_RUNTIME[self.tpu_generation]

    @property
    def config_file(self) -> str:
        return f"marin-{self.name}.yaml"


CLUSTERS: dict[str, ClusterSpec] = {
    spec.name: spec
    for spec in (
        ClusterSpec("us-central2", "us-central2", "us-central2-b", "v4", "v4-8", "gs://marin-us-central2"),
        ClusterSpec("us-west4", "us-west4", "us-west4-a", "v5e", "v5litepod-1", "gs://marin-us-west4"),
        ClusterSpec("eu-west4", "europe-west4", "europe-west4-b", "v5e", "v5litepod-1", "gs://marin-eu-west4"),
        ClusterSpec("us-east5", "us-east5", "us-east5-b", "v6e", "v6e-4", "gs://marin-us-east5"),
        ClusterSpec("us-east1", "us-east1", "us-east1-d", "v6e", "v6e-4", "gs://marin-us-east1"),
        ClusterSpec("us-central1", "us-central1", "us-central1-a", "v6e", "v6e-4", "gs://marin-us-central1"),
        # Staging: try a new image or template here first. Its own token secret, no standing workers.
        ClusterSpec(
            "us-central2-staging",
            "us-central2",
            "us-central2-b",
            "v4",
            "v4-8",
            "gs://marin-us-central2",
            min_workers=0,
            max_workers=16,
            auth_secret="RAY_AUTH_TOKEN_STAGING",
        ),
        # Reserved for the hero run: do not use for anything else.
        ClusterSpec(
            "big-run",
            "us-central2",
            "us-central2-b",
            "v4",
            "v4-8",
            "gs://marin-us-central2",
            capacity=Capacity.RESERVED,
        ),
    )
}


def get_cluster(name: str) -> ClusterSpec:
    """The table row for `name` (with or without the `marin-` prefix)."""
    key = name.removeprefix("marin-")
    if key not in CLUSTERS:
        choices = ", ".join([LOCAL_CLUSTER, *CLUSTERS])
        raise ValueError(f"Unknown cluster {name!r}; choose one of: {choices}")
    return CLUSTERS[key]


def infra_dir() -> Path:
    """The repository's `infra/` directory: $MARIN_INFRA_DIR, else found above cwd or this file."""
    if env := os.environ.get("MARIN_INFRA_DIR"):
        return Path(env)
    for start in (Path.cwd(), Path(__file__).resolve()):
        for parent in (start, *start.parents):
            if (parent / "infra" / TEMPLATE_NAME).is_file():
                return parent / "infra"
    raise FileNotFoundError(
        f"Could not find infra/{TEMPLATE_NAME} above {Path.cwd()}; run from the repository or set MARIN_INFRA_DIR"
    )


def config_path(spec: ClusterSpec, directory: Path | None = None) -> Path:
    return (directory or infra_dir()) / spec.config_file


def render_config(spec: ClusterSpec, template_dir: Path | None = None) -> str:
    """The generated launcher config for `spec`, banner included."""
    import jinja2

    env = jinja2.Environment(
        loader=jinja2.FileSystemLoader(str(template_dir or infra_dir())),
        undefined=jinja2.StrictUndefined,
        keep_trailing_newline=True,
    )
    body = env.get_template(TEMPLATE_NAME).render(
        cluster=spec,
        preemptible=spec.capacity is Capacity.PREEMPTIBLE,
        reserved=spec.capacity is Capacity.RESERVED,
    )
    return BANNER.format(template=TEMPLATE_NAME, name=spec.name) + body


def write_configs(directory: Path | None = None) -> list[Path]:
    """Regenerate every `infra/marin-<name>.yaml`; returns the paths written."""
    directory = directory or infra_dir()
    written = []
    for spec in CLUSTERS.values():
        path = config_path(spec, directory)
        path.write_text(render_config(spec, directory))
        written.append(path)
    return written


def check_configs(directory: Path | None = None) -> list[str]:
    """Names of the generated configs that are missing or differ from the template output."""
    directory = directory or infra_dir()
    stale = []
    for spec in CLUSTERS.values():
        path = config_path(spec, directory)
        if not path.is_file() or path.read_text() != render_config(spec, directory):
            stale.append(path.name)
    return stale


def cluster_from_config_file(path: str | os.PathLike) -> ClusterSpec:
    """The table row whose generated config is `path` (matched on its `cluster_name`)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"Cluster config {str(path)!r} does not exist; see `marin cluster list-configs`")
    data = yaml.safe_load(path.read_text()) or {}
    name = data.get("cluster_name")
    if not name:
        raise ValueError(f"{path} has no 'cluster_name'; is it a Ray cluster launcher config?")
    return get_cluster(name)
