"""Cluster maintenance: the image build/push, registry policy, token secret, ssh key, preempted TPU
VMs, the staging cluster and the Makefile (fast: no Ray, no cloud).

gcloud and docker cannot reach a cloud or a daemon here. Dry runs pin their exact command lines;
the paths that run them use stand-in executables on PATH that replay what the real CLI answers
(exit status, NOT_FOUND, JSON) and log every argv, so our decisions around them are exercised
for real: which commands run, in what order, what is refused, what is written where.
"""

from __future__ import annotations

import datetime as dt
import importlib.util
import json
import os
import re
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from marin.cluster import cli, config, housekeeping, image, registry
from marin.cluster.config import CLUSTERS

ROOT = Path(__file__).resolve().parents[3]
SENTINEL_TOKEN = "tok-SENTINEL-maint-0123456789"


@pytest.fixture(autouse=True)
def isolated_home(tmp_path, monkeypatch):
    """Token dir, ssh dir and local-cluster dir of this test only; no inherited cluster."""
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("MARIN_TOKEN_DIR", str(tmp_path / "tokens"))
    monkeypatch.setenv("MARIN_LOCAL_CLUSTER_DIR", str(tmp_path / "local"))
    monkeypatch.delenv("MARIN_CLUSTER", raising=False)
    (tmp_path / "home").mkdir()


def printed_commands(capsys, *args: str) -> list[list[str]]:
    """Run `marin cluster ARGS`; the command lines it printed (comments dropped)."""
    assert cli.main(list(args)) == 0
    captured = capsys.readouterr()
    assert SENTINEL_TOKEN not in captured.out + captured.err
    return [shlex.split(line) for line in captured.out.splitlines() if line and not line.startswith("#")]


# --- stand-in executables ----------------------------------------------------------------------

FAKE_TOOL = """\
#!{python}
# Stand-in for `{tool}`: logs argv, answers by the first matching rule of $FAKE_RULES.
import json, os, sys
argv = sys.argv[1:]
entry = {{"tool": {tool!r}, "argv": argv}}
for arg in argv:
    if arg.startswith("--data-file="):
        entry["data"] = open(arg.split("=", 1)[1]).read()
with open(os.environ["FAKE_LOG"], "a") as log:
    log.write(json.dumps(entry) + "\\n")
for rule in json.load(open(os.environ["FAKE_RULES"])):
    if rule["tool"] == {tool!r} and argv[: len(rule["prefix"])] == rule["prefix"]:
        sys.stdout.write(rule.get("stdout", ""))
        sys.stderr.write(rule.get("stderr", ""))
        sys.exit(rule.get("rc", 0))
"""


class FakeTools:
    """`gcloud`/`docker` stand-ins on PATH (with git), answering per rule; `calls()` is the log."""

    def __init__(self, tmp_path: Path, monkeypatch, tools=("gcloud", "docker")):
        self.bin = tmp_path / "fakebin"
        self.bin.mkdir()
        self.log = tmp_path / "fake.log"
        self.rules_file = tmp_path / "rules.json"
        self.rules: list[dict] = []
        self.save()
        for tool in tools:
            path = self.bin / tool
            path.write_text(FAKE_TOOL.format(python=sys.executable, tool=tool))
            path.chmod(0o755)
        (self.bin / "git").symlink_to(shutil.which("git"))
        monkeypatch.setenv("PATH", str(self.bin))
        monkeypatch.setenv("FAKE_LOG", str(self.log))
        monkeypatch.setenv("FAKE_RULES", str(self.rules_file))

    def answer(self, tool: str, prefix: list[str], *, stdout="", stderr="", rc=0) -> None:
        self.rules.append({"tool": tool, "prefix": prefix, "stdout": stdout, "stderr": stderr, "rc": rc})
        self.save()

    def save(self) -> None:
        self.rules_file.write_text(json.dumps(self.rules))

    def calls(self) -> list[dict]:
        if not self.log.exists():
            return []
        return [json.loads(line) for line in self.log.read_text().splitlines()]

    def argvs(self, tool: str) -> list[list[str]]:
        return [call["argv"] for call in self.calls() if call["tool"] == tool]


# --- the image ----------------------------------------------------------------------------------


def _head_commit() -> str:
    return subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"], capture_output=True,
                          text=True, check=True).stdout.strip()  # fmt: skip


def test_build_image_dry_run_prints_every_command_and_writes_nothing(capsys):
    before = Path(config.__file__).read_text()
    commands = printed_commands(capsys, "--dry-run", "build-image", "--region", "us-west4", "--region", "europe-west4")
    date = dt.datetime.now(dt.timezone.utc).strftime("%Y%m%d")
    tags = ["latest", _head_commit(), date]
    expected = [["docker", "build", "--platform=linux/amd64", "--file=docker/marin/Dockerfile.cluster",
                 "--tag=marin_cluster:latest", "."]]  # fmt: skip
    regions = ["us-west4", "europe-west4"]
    refs = {r: [f"{r}-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:{t}" for t in tags] for r in regions}
    expected += [["docker", "tag", "marin_cluster:latest", ref] for r in regions for ref in refs[r]]
    for r in regions:
        expected += [
            ["gcloud", "auth", "configure-docker", f"{r}-docker.pkg.dev", "--quiet"],
            ["gcloud", "artifacts", "repositories", "describe", "marin", f"--location={r}",
             "--project=hai-gcp-models", "--format=value(name)"],
            ["gcloud", "artifacts", "repositories", "create", "marin", "--repository-format=docker",
             f"--location={r}", "--project=hai-gcp-models", "--description=Marin cluster images"],
        ]  # fmt: skip
        expected += [["docker", "push", ref] for ref in refs[r]]
    assert commands == expected
    assert Path(config.__file__).read_text() == before


def test_makefile_regions_are_the_cluster_table_regions():
    """CLUSTER_REPOS (where images and policies go) must cover every region a cluster runs in."""
    match = re.search(r"^CLUSTER_REPOS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match and match.group(1).split() == image.default_regions()
    assert "europe-west4" in image.default_regions() and len(set(image.default_regions())) == 6


def test_build_image_pushes_everywhere_creates_missing_repos_and_records_the_tag(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("docker", ["info"], stdout="28.2.2\n")
    fake.answer("gcloud", ["artifacts", "repositories", "describe", "marin", "--location=us-west4"],
                stderr="ERROR: (gcloud.artifacts.repositories.describe) NOT_FOUND: Requested entity was not found.\n",
                rc=1)  # fmt: skip
    config_copy = tmp_path / "config.py"
    shutil.copy(config.__file__, config_copy)
    now = dt.datetime(2027, 3, 4, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))  # 2027-03-05 in UTC
    plan = image.plan_image(["us-central2", "us-west4"], "hai-gcp-models", now=now)
    assert plan.tags == ("latest", _head_commit(), "20270305")
    image.build_and_push(plan, dry_run=False, config_file=config_copy)

    docker = fake.argvs("docker")
    assert docker[0] == ["info", "--format={{.ServerVersion}}"] and docker[1][0] == "build"
    pushed = [argv[1] for argv in docker if argv[0] == "push"]
    assert pushed == plan.refs("us-central2") + plan.refs("us-west4")
    created = [argv for argv in fake.argvs("gcloud") if argv[:3] == ["artifacts", "repositories", "create"]]
    assert [argv[5] for argv in created] == ["--location=us-west4"]  # only the missing repository
    # every region's docker auth is configured before its first push
    order = [(c["tool"], c["argv"][:2]) for c in fake.calls()]
    assert order.index(("gcloud", ["auth", "configure-docker"])) < order.index(("docker", ["push", plan.refs("us-central2")[0]]))

    # the tag landed where update-configs reads it: the module's LATEST_DOCKER_TAG and every default spec
    spec = importlib.util.spec_from_file_location("config_copy", config_copy)
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_copy"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["config_copy"]
    assert module.LATEST_DOCKER_TAG == "20270305"
    assert module.CLUSTERS["us-west4"].docker_image.endswith("/marin/marin_cluster:20270305")
    assert config_copy.read_text().replace('"20270305"', f'"{config.LATEST_DOCKER_TAG}"') == Path(config.__file__).read_text()
    assert "update-configs" in capsys.readouterr().out


def test_build_image_stops_on_a_registry_error_other_than_not_found(tmp_path, monkeypatch):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["artifacts", "repositories", "describe"], stderr="PERMISSION_DENIED: caller lacks\n", rc=1)
    plan = image.plan_image(["us-east1"], "hai-gcp-models")
    with pytest.raises(RuntimeError, match="PERMISSION_DENIED"):
        image.build_and_push(plan, dry_run=False, config_file=tmp_path / "never-written.py")
    assert not any(argv[0] == "push" for argv in fake.argvs("docker"))
    assert not any(argv[:3] == ["artifacts", "repositories", "create"] for argv in fake.argvs("gcloud"))


def test_record_latest_tag_rewrites_exactly_one_line(tmp_path):
    path = tmp_path / "config.py"
    path.write_text('A = 1\nLATEST_DOCKER_TAG = "20240101"\nB = "LATEST_DOCKER_TAG"\n')
    image.record_latest_tag("20261231", path)
    assert path.read_text() == 'A = 1\nLATEST_DOCKER_TAG = "20261231"\nB = "LATEST_DOCKER_TAG"\n'
    with pytest.raises(ValueError, match="not a valid docker tag"):
        image.record_latest_tag("bad tag!", path)
    path.write_text('LATEST_DOCKER_TAG = "1"\nLATEST_DOCKER_TAG = "2"\n')
    with pytest.raises(ValueError, match="exactly one"):
        image.record_latest_tag("3", path)


# --- missing tools ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("args", "tools"),
    [
        (["build-image", "--region", "us-central2"], "docker, gcloud"),
        (["build-image", "--region", "us-central2", "--no-push"], "docker,"),
        (["--cluster", "us-central2", "auth"], "gcloud,"),
        (["--cluster", "us-central2-staging", "init-auth-secret"], "gcloud,"),
        (["--cluster", "us-east5", "clean-preempted-tpus"], "gcloud,"),
        (["install-ssh-key"], "gcloud,"),
        (["--cluster", "us-west4", "start-cluster"], "ray,"),
        (["--cluster", "us-west4", "dashboard"], "ray,"),
        (["--cluster", "us-west4", "add-worker", "v5litepod-4"], "gcloud,"),
    ],
)
def test_a_missing_tool_is_refused_before_anything_runs(tmp_path, monkeypatch, capsys, args, tools):
    fake_bin = tmp_path / "onlygit"
    fake_bin.mkdir()
    (fake_bin / "git").symlink_to(shutil.which("git"))
    monkeypatch.setenv("PATH", str(fake_bin))
    assert cli.main(args) == 2
    err = capsys.readouterr().err
    assert f"needs {tools.rstrip(',')}, not found on PATH" in err
    for tool in tools.rstrip(",").split(", "):  # each missing tool comes with how to get it
        assert f"`{tool}`: " in err
    # the same command with --dry-run needs no tool: it only prints
    assert cli.main(["--dry-run", *args]) == 0


@pytest.mark.skipif(shutil.which("docker") is None, reason="needs the docker CLI (no daemon needed)")
def test_docker_without_a_reachable_daemon_is_refused_clearly(monkeypatch, tmp_path):
    """The real docker CLI, pointed at a socket nobody serves (as on this machine: CLI, no engine)."""
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no-daemon.sock")
    plan = image.plan_image(["us-central2"], "hai-gcp-models")
    with pytest.raises(RuntimeError, match="docker is installed but cannot reach its daemon"):
        image.build_and_push(plan, dry_run=False, push=False)


# --- the registry cleanup policy ----------------------------------------------------------------

_CONDITION_KEYS = {"tagState", "tagPrefixes", "versionNamePrefixes", "packageNamePrefixes", "olderThan", "newerThan"}


def artifact_registry_policy_errors(document) -> list[str]:
    """Problems of a cleanup-policy file by Artifact Registry's format (see docs/cluster.md).

    A JSON list of policies; each has a unique `name`, an `action.type` of Delete or Keep (the API's
    DELETE/KEEP, any case), and exactly one of `condition` (tagState tagged|untagged|any, prefix
    lists, olderThan/newerThan durations like "30d") or `mostRecentVersions` (positive keepCount,
    Keep only).
    """
    if not isinstance(document, list) or not document:
        return ["the policy file must be a non-empty JSON list of policies"]
    errors, names = [], set()
    for i, policy in enumerate(document):
        name = policy.get("name") if isinstance(policy, dict) else None
        if not name or name in names:
            errors.append(f"policy {i}: missing or duplicate name")
            continue
        names.add(name)
        kind = str((policy.get("action") or {}).get("type", "")).upper()
        if kind not in {"DELETE", "KEEP"}:
            errors.append(f"{name}: action.type must be Delete or Keep")
        if ("condition" in policy) == ("mostRecentVersions" in policy):
            errors.append(f"{name}: exactly one of condition / mostRecentVersions")
        condition = policy.get("condition", {})
        if set(condition) - _CONDITION_KEYS:
            errors.append(f"{name}: unknown condition keys {sorted(set(condition) - _CONDITION_KEYS)}")
        if "tagState" in condition and str(condition["tagState"]).upper() not in {"TAGGED", "UNTAGGED", "ANY"}:
            errors.append(f"{name}: tagState must be tagged, untagged or any")
        for key in ("olderThan", "newerThan"):
            if key in condition and not re.fullmatch(r"\d+[smhd]", str(condition[key])):
                errors.append(f"{name}: {key} must be a duration like 30d")
        if "mostRecentVersions" in policy:
            keep = policy["mostRecentVersions"].get("keepCount")
            if kind != "KEEP" or not isinstance(keep, int) or keep < 1:
                errors.append(f"{name}: mostRecentVersions needs a Keep action and a positive keepCount")
    return errors


def test_committed_policy_file_is_the_generated_one_and_follows_the_format():
    assert registry.check_policy_file() == [], "run `uv run marin cluster update-configs` and commit infra/"
    document = json.loads(registry.policy_path().read_text())
    assert artifact_registry_policy_errors(document) == []
    delete = [p for p in document if p["action"]["type"] == "Delete"]
    keep = [p for p in document if p["action"]["type"] == "Keep"]
    assert [p["condition"] for p in delete] == [{"tagState": "any", "olderThan": "30d"}]
    assert [p["mostRecentVersions"] for p in keep] == [{"keepCount": 16}]


@pytest.mark.parametrize(
    "bad",
    [
        {},
        [{"name": "a", "action": {"type": "Remove"}, "condition": {"olderThan": "30d"}}],
        [{"name": "a", "action": {"type": "Keep"}, "condition": {}, "mostRecentVersions": {"keepCount": 1}}],
        [{"name": "a", "action": {"type": "Delete"}, "mostRecentVersions": {"keepCount": 16}}],
        [{"name": "a", "action": {"type": "Delete"}, "condition": {"olderThan": "30 days"}}],
        [{"name": "a", "action": {"type": "Delete"}, "condition": {"age": "30d"}}],
        [{"name": "a", "action": {"type": "Keep"}, "mostRecentVersions": {"keepCount": 0}}],
    ],
)
def test_the_format_check_rejects_malformed_policies(bad):
    assert artifact_registry_policy_errors(bad)


def test_policy_drift_is_detected(tmp_path):
    assert registry.check_policy_file(tmp_path) == [registry.POLICY_FILE]
    registry.write_policy_file(tmp_path)
    assert registry.check_policy_file(tmp_path) == []
    path = registry.policy_path(tmp_path)
    path.write_text(path.read_text().replace('"keepCount": 16', '"keepCount": 8'))
    assert registry.check_policy_file(tmp_path) == [registry.POLICY_FILE]


def test_configure_gcp_registry_script_command_line():
    script = [sys.executable, "infra/configure_gcp_registry.py"]
    run = subprocess.run([*script, "marin", "--region=us-east5", "--project=p1", "--dry-run"],
                         cwd=ROOT, capture_output=True, text=True)  # fmt: skip
    assert run.returncode == 0, run.stderr
    assert shlex.split(run.stdout) == [
        "gcloud", "artifacts", "repositories", "set-cleanup-policies", "marin", "--location=us-east5",
        "--project=p1", "--policy=infra/artifact-registry-cleanup-policy.json", "--no-dry-run",
    ]  # fmt: skip
    # without --project, gcloud's configured project is used
    run = subprocess.run([*script, "marin", "--region=us-east5", "--dry-run"], cwd=ROOT, capture_output=True, text=True)
    assert "--project" not in run.stdout
    run = subprocess.run([*script, "marin"], cwd=ROOT, capture_output=True, text=True)
    assert run.returncode == 2 and "--region" in run.stderr


# --- the token secret and the ssh key -----------------------------------------------------------


def test_init_auth_secret_dry_run(capsys, tmp_path):
    describe, generate, create = printed_commands(capsys, "--cluster", "us-central2-staging", "--dry-run",
                                                  "init-auth-secret")  # fmt: skip
    assert describe == ["gcloud", "secrets", "describe", "RAY_AUTH_TOKEN_STAGING", "--project=hai-gcp-models",
                        "--format=value(name)"]  # fmt: skip
    assert generate[-4:] == ["get-auth-token", "--generate", ">", "/dev/null"]
    assert create[:6] == ["gcloud", "secrets", "create", "RAY_AUTH_TOKEN_STAGING", "--project=hai-gcp-models",
                          "--replication-policy=automatic"]  # fmt: skip
    assert create[6].startswith("--data-file=")


def test_init_auth_secret_creates_once_from_a_generated_token_and_never_shows_it(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["secrets", "describe"], stderr="NOT_FOUND: Secret [RAY_AUTH_TOKEN] not found\n", rc=1)
    assert cli.main(["--cluster", "us-central2", "init-auth-secret"]) == 0
    out = capsys.readouterr()
    (create,) = [c for c in fake.calls() if c["argv"][:2] == ["secrets", "create"]]
    token = create["data"].strip()
    assert len(token) >= 32
    installed = tmp_path / "tokens" / "auth_token"
    assert installed.read_text().strip() == token and installed.stat().st_mode & 0o777 == 0o600
    assert token not in out.out + out.err and all(token not in arg for c in fake.calls() for arg in c["argv"])
    data_file = Path(create["argv"][-1].split("=", 1)[1])
    assert not data_file.exists()  # the scratch copy is gone


def test_init_auth_secret_refuses_to_overwrite_an_existing_secret(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["secrets", "describe"], stdout="projects/1/secrets/RAY_AUTH_TOKEN_STAGING\n")
    assert cli.main(["--cluster", "us-central2-staging", "init-auth-secret"]) == 2
    assert "already exists" in capsys.readouterr().err
    assert [argv[:2] for argv in fake.argvs("gcloud")] == [["secrets", "describe"]]  # nothing created
    assert not (tmp_path / "tokens").exists()


def test_init_auth_secret_stops_when_the_secret_cannot_be_checked(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["secrets", "describe"], stderr="PERMISSION_DENIED: no access\n", rc=1)
    assert cli.main(["--cluster", "us-central2", "init-auth-secret"]) == 2
    assert "PERMISSION_DENIED" in capsys.readouterr().err
    assert len(fake.argvs("gcloud")) == 1


def test_install_ssh_key_writes_a_private_key_and_keeps_existing_files(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    key = "-----BEGIN OPENSSH PRIVATE KEY-----\nabc\n-----END OPENSSH PRIVATE KEY-----\n"
    fake.answer("gcloud", ["secrets", "versions", "access", "latest", "--secret=RAY_CLUSTER_PRIVATE_KEY"], stdout=key)
    fake.answer("gcloud", ["secrets", "versions", "access", "latest", "--secret=RAY_CLUSTER_PUBLIC_KEY"],
                stdout="ssh-ed25519 AAAA ray")  # fmt: skip
    assert cli.main(["install-ssh-key"]) == 0
    assert "BEGIN OPENSSH" not in capsys.readouterr().out
    private = tmp_path / "home" / ".ssh" / "marin_ray_cluster.pem"
    assert private.read_text() == key and private.stat().st_mode & 0o777 == 0o600
    assert (private.with_suffix(".pub")).read_text() == "ssh-ed25519 AAAA ray\n"
    calls = len(fake.calls())
    assert cli.main(["install-ssh-key"]) == 0  # both exist: nothing fetched again
    assert len(fake.calls()) == calls and "kept" in capsys.readouterr().out


# --- preempted TPU VMs --------------------------------------------------------------------------


def _tpu(name: str, state: str, cluster: str | None = None) -> dict:
    labels = {"ray-cluster-name": cluster, "ray-node-type": "worker"} if cluster else {}
    return {
        "name": f"projects/hai-gcp-models/locations/us-central2-b/nodes/{name}",
        "state": state,
        "acceleratorType": "v4-8",
        "createTime": "2026-11-01T00:00:00Z",
        "labels": labels,
        "networkEndpoints": [{"ipAddress": "10.0.0.2", "port": 8470}],
    }


TPU_LIST = [
    _tpu("ray-marin-us-central2-worker-aaaa-tpu", "PREEMPTED", "marin-us-central2"),
    _tpu("ray-marin-us-central2-worker-bbbb-tpu", "READY", "marin-us-central2"),
    _tpu("ray-marin-us-central2-worker-cccc-tpu", "TERMINATED", "marin-us-central2"),
    _tpu("ray-marin-us-central2-worker-dddd-tpu", "CREATING", "marin-us-central2"),
    _tpu("ray-marin-us-central2-staging-worker-eeee-tpu", "PREEMPTED", "marin-us-central2-staging"),
    _tpu("ray-marin-big-run-worker-ffff-tpu", "PREEMPTED", "marin-big-run"),
    _tpu("ray-worker-us-central2-v4-128-1a2b3c", "PREEMPTED"),  # add-worker's default name
    _tpu("ray-worker-us-central2-staging-v4-8-4d5e6f", "PREEMPTED"),  # staging's, not ours
    _tpu("someones-experiment", "PREEMPTED"),  # not a cluster VM
]


def test_preempted_tpus_are_the_clusters_dead_vms_only():
    found = housekeeping.preempted_tpus(TPU_LIST, CLUSTERS["us-central2"])
    assert [vm.name for vm in found] == [
        "ray-marin-us-central2-worker-aaaa-tpu",
        "ray-marin-us-central2-worker-cccc-tpu",
        "ray-worker-us-central2-v4-128-1a2b3c",
    ]
    staging = housekeeping.preempted_tpus(TPU_LIST, CLUSTERS["us-central2-staging"])
    assert [vm.name for vm in staging] == [
        "ray-marin-us-central2-staging-worker-eeee-tpu",
        "ray-worker-us-central2-staging-v4-8-4d5e6f",
    ]


def test_clean_preempted_tpus_previews_first_and_deletes_only_with_yes(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["compute", "tpus", "tpu-vm", "list"], stdout=json.dumps(TPU_LIST))
    assert cli.main(["--cluster", "us-central2", "clean-preempted-tpus"]) == 0
    preview = capsys.readouterr()
    assert [argv[:4] for argv in fake.argvs("gcloud")] == [["compute", "tpus", "tpu-vm", "list"]]  # nothing deleted
    printed = [shlex.split(line) for line in preview.out.splitlines() if not line.startswith("#")]
    assert printed == [
        ["gcloud", "compute", "tpus", "tpu-vm", "delete", name, "--zone=us-central2-b", "--project=hai-gcp-models",
         "--quiet", "--async"]
        for name in ("ray-marin-us-central2-worker-aaaa-tpu", "ray-marin-us-central2-worker-cccc-tpu",
                     "ray-worker-us-central2-v4-128-1a2b3c")
    ]  # fmt: skip
    assert "--yes" in preview.err

    assert cli.main(["--cluster", "us-central2", "clean-preempted-tpus", "--yes"]) == 0
    deleted = [argv for argv in fake.argvs("gcloud") if argv[:4] == ["compute", "tpus", "tpu-vm", "delete"]]
    assert deleted == [argv[1:] for argv in printed]  # exactly what the preview showed


def test_clean_preempted_tpus_dry_run_and_local(capsys):
    listing, delete = printed_commands(capsys, "--cluster", "big-run", "--dry-run", "clean-preempted-tpus")
    assert listing == ["gcloud", "compute", "tpus", "tpu-vm", "list", "--zone=us-central2-b",
                       "--project=hai-gcp-models", "--format=json"]  # fmt: skip
    assert delete[:6] == ["gcloud", "compute", "tpus", "tpu-vm", "delete", "<name>"]
    assert cli.main(["--cluster", "local", "clean-preempted-tpus"]) == 2
    assert "cloud clusters" in capsys.readouterr().err


# --- the staging cluster ------------------------------------------------------------------------


def test_staging_cluster_config_is_generated_from_the_template():
    spec = CLUSTERS["us-central2-staging"]
    text = (config.infra_dir() / "marin-us-central2-staging.yaml").read_text()
    assert text == config.render_config(spec)  # drift check, as for every generated config
    data = yaml.safe_load(text)
    assert data["cluster_name"] == "marin-us-central2-staging"
    assert data["available_node_types"]["tpu_worker"]["min_workers"] == 0
    setup = "\n".join(data["setup_commands"])
    assert "--secret=RAY_AUTH_TOKEN_STAGING" in setup and "--secret=RAY_AUTH_TOKEN " not in setup


@pytest.mark.parametrize(
    ("cluster", "secret", "token_file"),
    [
        ("us-central2", "RAY_AUTH_TOKEN", "auth_token"),
        ("us-east5", "RAY_AUTH_TOKEN", "auth_token"),
        ("us-central2-staging", "RAY_AUTH_TOKEN_STAGING", "auth_token_RAY_AUTH_TOKEN_STAGING"),
        ("infra/marin-us-central2-staging.yaml", "RAY_AUTH_TOKEN_STAGING", "auth_token_RAY_AUTH_TOKEN_STAGING"),
    ],
)
def test_auth_and_auth_env_pick_each_clusters_token(capsys, tmp_path, cluster, secret, token_file):
    path = tmp_path / "tokens" / token_file
    assert cli.main(["--dry-run", "--cluster", cluster, "auth"]) == 0
    assert capsys.readouterr().out.strip() == (
        f"gcloud secrets versions access latest --secret={secret} --project=hai-gcp-models > {path}"
    )
    assert cli.main(["--cluster", cluster, "auth-env"]) == 0
    assert f"export RAY_AUTH_TOKEN_PATH={path}" in capsys.readouterr().out.splitlines()


# --- the Makefile -------------------------------------------------------------------------------

needs_make = pytest.mark.skipif(shutil.which("make") is None, reason="needs make")


def make(*args: str, **env: str) -> subprocess.CompletedProcess:
    marin = f"{sys.executable} -m marin.cli"
    return subprocess.run(["make", "--no-print-directory", f"MARIN={marin}", f"PYTHON={sys.executable}", *args],
                          cwd=ROOT, capture_output=True, text=True, env={**os.environ, **env})  # fmt: skip


@needs_make
@pytest.mark.parametrize(
    ("target", "command"),
    [
        ("get_ray_auth_token", "cluster --cluster us-central2 auth"),
        ("get_ray_auth_token_staging", "cluster --cluster us-central2-staging auth"),
        ("init_ray_auth_token_secret", "cluster --cluster us-central2 init-auth-secret"),
        ("cluster_docker", "cluster build-image --region us-central2 --region us-west4 --region europe-west4 "
                           "--region us-east5 --region us-east1 --region us-central1"),
        ("clean_preempted_tpus", "cluster --cluster us-central2 clean-preempted-tpus"),
    ],
)  # fmt: skip
def test_make_targets_are_thin_calls_of_the_cli(target, command):
    run = make("-n", target)
    assert run.returncode == 0, run.stderr
    lines = [line for line in run.stdout.splitlines() if not line.startswith("command -v")]
    assert [shlex.split(line) for line in lines] == [[sys.executable, "-m", "marin.cli", *shlex.split(command)]]


@needs_make
def test_make_dry_run_prints_the_cloud_command_lines(tmp_path):
    run = make("configure_gcp_registry_all", "DRY_RUN=1", "CLUSTER_REPOS=us-central2 europe-west4")
    assert run.returncode == 0, run.stderr
    gcloud = [line for line in run.stdout.splitlines() if line.startswith("gcloud")]
    assert gcloud == [
        f"gcloud artifacts repositories set-cleanup-policies marin --location={region} "
        "--policy=infra/artifact-registry-cleanup-policy.json --no-dry-run"
        for region in ("us-central2", "europe-west4")
    ]
    run = make("dev_setup", "DRY_RUN=1")
    assert run.returncode == 0, run.stderr
    assert [line.split(" > ")[0] for line in run.stdout.splitlines() if line.startswith("gcloud")] == [
        "gcloud secrets versions access latest --secret=RAY_CLUSTER_PRIVATE_KEY --project=hai-gcp-models",
        "gcloud secrets versions access latest --secret=RAY_CLUSTER_PUBLIC_KEY --project=hai-gcp-models",
        "gcloud secrets versions access latest --secret=RAY_AUTH_TOKEN --project=hai-gcp-models",
    ]
    run = make("clean_preempted_tpus", "DRY_RUN=1", "CLUSTER=us-east1", "YES=1")
    assert run.returncode == 0 and "--zone=us-east1-d" in run.stdout


@needs_make
def test_make_refuses_clearly_without_uv():
    run = subprocess.run(["make", "get_ray_auth_token", "MARIN=no-such-uv run marin"], cwd=ROOT,
                         capture_output=True, text=True)  # fmt: skip
    assert run.returncode != 0 and "'no-such-uv' not found: install uv" in run.stderr


def test_docs_name_every_make_target_and_command():
    docs = (ROOT / "docs" / "cluster.md").read_text()
    targets = re.findall(r"^([a-z_]+):", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert {"dev_setup", "get_ray_auth_token_staging", "init_ray_auth_token_secret", "cluster_docker",
            "configure_gcp_registry_all"} <= set(targets)  # fmt: skip
    for name in [*targets, "build-image", "install-ssh-key", "init-auth-secret", "clean-preempted-tpus",
                 "configure_gcp_registry.py", "restart-cluster"]:  # fmt: skip
        assert name in docs, f"docs/cluster.md does not mention {name}"


def test_dashboard_without_ssh_is_refused_clearly(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch, tools=("ray",))
    fake.answer("ray", ["get-head-ip"], stdout="10.1.2.3\n")
    assert cli.main(["--cluster", "us-west4", "dashboard"]) == 2
    assert "Forwarding the dashboard needs ssh, not found on PATH" in capsys.readouterr().err
    assert fake.argvs("ray") == [["get-head-ip", "infra/marin-us-west4.yaml"]]
