"""The cluster table and the generated `infra/marin-<name>.yaml` files (fast: no Ray, no cloud)."""

from __future__ import annotations

import shutil

import pytest
import yaml

from marin.cluster import cli, config
from marin.cluster.config import CLUSTERS, TEMPLATE_NAME, Capacity


def test_committed_configs_match_the_template():
    """Fails when someone edits the template or the table without `marin cluster update-configs`."""
    assert config.check_configs() == [], "run `uv run marin cluster update-configs` and commit infra/"


def test_update_configs_check_command(capsys):
    assert cli.main(["update-configs", "--check"]) == 0
    assert "match" in capsys.readouterr().out


def test_update_configs_regenerates_and_detects_drift(tmp_path):
    shutil.copy(config.infra_dir() / TEMPLATE_NAME, tmp_path / TEMPLATE_NAME)
    assert sorted(config.check_configs(tmp_path)) == sorted(s.config_file for s in CLUSTERS.values())
    written = config.write_configs(tmp_path)
    assert len(written) == len(CLUSTERS) and config.check_configs(tmp_path) == []
    for path in written:  # byte-identical to the committed files
        assert path.read_text() == (config.infra_dir() / path.name).read_text()
    edited = tmp_path / "marin-us-west4.yaml"
    edited.write_text(edited.read_text().replace("max_workers: 1024", "max_workers: 2048", 1))
    assert config.check_configs(tmp_path) == ["marin-us-west4.yaml"]


def test_cluster_table_lists_the_seeded_clusters():
    expected = {
        "us-central2": "v4",
        "us-west4": "v5e",
        "eu-west4": "v5e",
        "us-east5": "v6e",
        "us-east1": "v6e",
        "us-central1": "v6e",
        "us-central2-staging": "v4",
        "big-run": "v4",
    }
    assert {name: spec.tpu_generation for name, spec in CLUSTERS.items()} == expected
    assert CLUSTERS["big-run"].capacity is Capacity.RESERVED
    # staging has its own token; every other cluster shares the production one
    assert {name for name, spec in CLUSTERS.items() if spec.auth_secret != "RAY_AUTH_TOKEN"} == {"us-central2-staging"}
    assert CLUSTERS["eu-west4"].region == "europe-west4"


@pytest.mark.parametrize("name", list(CLUSTERS))
def test_generated_config_keeps_its_promises(name):
    spec = CLUSTERS[name]
    text = (config.infra_dir() / spec.config_file).read_text()
    assert text.startswith("# GENERATED FILE, DO NOT EDIT.")
    data = yaml.safe_load(text)
    assert data["cluster_name"] == f"marin-{name}"
    assert data["provider"]["type"] == "gcp" and data["provider"]["availability_zone"] == spec.zone
    head = data["available_node_types"][data["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # nothing scheduled on the shared head
    assert head["node_config"]["machineType"] == "n2-standard-8"
    assert head["node_config"]["disks"][0]["initializeParams"]["diskSizeGb"] == 200
    assert head["node_config"]["scheduling"]["preemptible"] is False
    worker = data["available_node_types"]["tpu_worker"]
    assert (worker["min_workers"], worker["max_workers"]) == (spec.min_workers, spec.max_workers)
    if name != "us-central2-staging":  # staging keeps no standing workers
        assert (spec.min_workers, spec.max_workers) == (4, 1024)
    assert worker["resources"] == {"CPU": 120}
    assert worker["node_config"]["acceleratorType"] == spec.worker_tpu_type
    scheduling = worker["node_config"]["schedulingConfig"]
    assert scheduling["preemptible"] is (spec.capacity is Capacity.PREEMPTIBLE)
    assert data["docker"]["image"] == f"{spec.region}-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:{spec.docker_tag}"
    run_options = data["docker"]["run_options"]
    assert "-e RAY_AUTH_MODE=token" in run_options
    assert f"-e MARIN_PREFIX={spec.bucket}" in run_options
    setup = "\n".join(data["setup_commands"])
    assert f"--secret={spec.auth_secret}" in setup and "/home/ray/.ray/auth_token" in setup
    assert "--num-cpus=120" in data["worker_start_ray_commands"][-1]
    assert "--num-cpus=0" in data["head_start_ray_commands"][-1]


def test_config_file_and_name_resolve_to_the_same_cluster():
    spec = config.cluster_from_config_file(config.infra_dir() / "marin-us-east5.yaml")
    assert spec is config.get_cluster("us-east5") is config.get_cluster("marin-us-east5")
    with pytest.raises(ValueError, match="choose one of: local, us-central2"):
        config.get_cluster("us-nowhere")
    with pytest.raises(FileNotFoundError, match="list-configs"):
        config.cluster_from_config_file("infra/marin-missing.yaml")
