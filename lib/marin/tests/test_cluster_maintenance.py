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


# 2027-03-04 23:30 in New York is 2027-03-05 in UTC: the date in the tag must be the UTC one.
BUILD_TIME = dt.datetime(2027, 3, 4, 23, 30, tzinfo=dt.timezone(dt.timedelta(hours=-5)))
ALL_REGIONS = ["us-central2", "us-west4", "europe-west4", "us-east5", "us-east1", "us-central1"]


def _git(repo: Path, *args: str) -> str:
    argv = ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.com", "-c", "commit.gpgsign=false"]
    return subprocess.run([*argv, *args], capture_output=True, text=True, check=True).stdout.strip()


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A committed copy of what build-image reads (infra/, docker/), used as the repository root.

    The real checkout's commit and cleanliness change while people work; this one's do not. The
    build clock is fixed too (`image.utc_now`), so no test depends on the day it runs.
    """
    repo = tmp_path / "repo"
    for rel in ("infra", "docker"):
        shutil.copytree(ROOT / rel, repo / rel)
    _git(tmp_path, "init", "-q", str(repo))
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "init")
    monkeypatch.setenv("MARIN_INFRA_DIR", str(repo / "infra"))
    monkeypatch.chdir(repo)
    monkeypatch.setattr(image, "utc_now", lambda: BUILD_TIME)
    return repo, _git(repo, "rev-parse", "--short", "HEAD")


def _expected_build(commit: str, regions: list[str]) -> list[list[str]]:
    tags = ["latest", commit, f"20270305-{commit}"]
    expected = [["docker", "build", "--pull", "--platform=linux/amd64", "--file=docker/marin/Dockerfile.cluster",
                 "--tag=marin_cluster:latest", "."]]  # fmt: skip
    refs = {r: [f"{r}-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:{t}" for t in tags] for r in regions}
    expected += [["docker", "tag", "marin_cluster:latest", ref] for r in regions for ref in refs[r]]
    for r in regions:
        expected += [
            ["gcloud", "auth", "configure-docker", f"{r}-docker.pkg.dev", "--quiet"],
            ["gcloud", "artifacts", "repositories", "describe", "marin", f"--location={r}",
             "--project=hai-gcp-models", "--format=value(name)"],
            ["gcloud", "artifacts", "repositories", "create", "marin", "--repository-format=docker",
             f"--location={r}", "--project=hai-gcp-models", "--description=Marin cluster images"],
            ["gcloud", "artifacts", "repositories", "set-cleanup-policies", "marin", f"--location={r}",
             "--project=hai-gcp-models", "--policy=infra/artifact-registry-cleanup-policy.json", "--no-dry-run"],
        ]  # fmt: skip
        expected += [["docker", "push", ref] for ref in refs[r]]
    return expected


def test_build_image_dry_run_prints_every_command_and_writes_nothing(checkout, capsys):
    _, commit = checkout
    before = Path(config.__file__).read_text()
    args = ["--dry-run", "build-image", "--region", "us-west4", "--region", "europe-west4"]
    assert printed_commands(capsys, *args) == _expected_build(commit, ["us-west4", "europe-west4"])
    assert Path(config.__file__).read_text() == before
    # every region: the same lines, and the tag that would be recorded
    assert cli.main(["--dry-run", "build-image"]) == 0
    out = capsys.readouterr().out
    assert [shlex.split(line) for line in out.splitlines() if not line.startswith("#")] == _expected_build(
        commit, ALL_REGIONS
    )
    assert f'# then set LATEST_DOCKER_TAG = "20270305-{commit}"' in out


def test_makefile_regions_are_the_cluster_table_regions():
    """CLUSTER_REPOS (where images and policies go) must cover every region a cluster runs in."""
    match = re.search(r"^CLUSTER_REPOS \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert match and match.group(1).split() == image.default_regions() == ALL_REGIONS
    project = re.search(r"^PROJECT \?= (.+)$", (ROOT / "Makefile").read_text(), re.MULTILINE)
    assert project and project.group(1) == config.DEFAULT_PROJECT  # the project build-image defaults to


def _load_config(path: Path):
    """`path` imported as a module, as `update-configs` would read it."""
    spec = importlib.util.spec_from_file_location("config_copy", path)
    module = importlib.util.module_from_spec(spec)
    sys.modules["config_copy"] = module
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules["config_copy"]
    return module


def test_build_image_pushes_everywhere_creates_missing_repos_and_records_the_tag(checkout, tmp_path, monkeypatch,
                                                                                 capsys):  # fmt: skip
    _, commit = checkout
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("docker", ["info"], stdout="28.2.2\n")
    fake.answer("gcloud", ["artifacts", "repositories", "describe", "marin", "--location=us-west4"],
                stderr="ERROR: (gcloud.artifacts.repositories.describe) NOT_FOUND: Requested entity was not found.\n",
                rc=1)  # fmt: skip
    config_copy = tmp_path / "config.py"
    shutil.copy(config.__file__, config_copy)
    plan = image.plan_image(None, "hai-gcp-models", now=BUILD_TIME)
    assert plan.regions == tuple(ALL_REGIONS) and plan.tags == ("latest", commit, f"20270305-{commit}")
    image.build_and_push(plan, dry_run=False, config_file=config_copy)

    docker = fake.argvs("docker")
    assert docker[0] == ["info", "--format={{.ServerVersion}}"] and docker[1][:2] == ["build", "--pull"]
    pushed = [argv[1] for argv in docker if argv[0] == "push"]
    assert pushed == [ref for region in ALL_REGIONS for ref in plan.refs(region)]
    gcloud = fake.argvs("gcloud")
    created = [argv for argv in gcloud if argv[:3] == ["artifacts", "repositories", "create"]]
    assert [argv[5] for argv in created] == ["--location=us-west4"]  # only the missing repository
    # ... which gets the cleanup policy right after it is created, in the same project
    policies = [argv for argv in gcloud if argv[:3] == ["artifacts", "repositories", "set-cleanup-policies"]]
    assert policies == [["artifacts", "repositories", "set-cleanup-policies", "marin", "--location=us-west4",
                         "--project=hai-gcp-models", "--policy=infra/artifact-registry-cleanup-policy.json",
                         "--no-dry-run"]]  # fmt: skip
    assert gcloud.index(created[0]) + 1 == gcloud.index(policies[0])
    # every region's docker auth is configured before its first push
    order = [(c["tool"], c["argv"][:2]) for c in fake.calls()]
    assert order.index(("gcloud", ["auth", "configure-docker"])) < order.index(("docker", ["push", plan.refs("us-central2")[0]]))

    # the tag landed where update-configs reads it: the module's LATEST_DOCKER_TAG and every default spec
    module = _load_config(config_copy)
    assert module.LATEST_DOCKER_TAG == f"20270305-{commit}"
    assert module.CLUSTERS["us-west4"].docker_image.endswith(f"/marin/marin_cluster:20270305-{commit}")
    expected_text = Path(config.__file__).read_text().replace(f'"{config.LATEST_DOCKER_TAG}"', f'"20270305-{commit}"', 1)
    assert config_copy.read_text() == expected_text
    assert "update-configs" in capsys.readouterr().out


def test_a_push_to_some_regions_is_not_recorded_as_every_clusters_tag(checkout, tmp_path, monkeypatch, capsys):
    """LATEST_DOCKER_TAG goes into every cluster's config: a tag only us-west4 has would break the others."""
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("docker", ["info"], stdout="28.2.2\n")
    config_copy = tmp_path / "config.py"
    shutil.copy(config.__file__, config_copy)
    plan = image.plan_image(["us-west4"], "hai-gcp-models")
    assert not plan.records_tag and "us-central2" in plan.missing_regions
    image.build_and_push(plan, dry_run=False, config_file=config_copy)
    assert [argv[1] for argv in fake.argvs("docker") if argv[0] == "push"] == plan.refs("us-west4")  # pushed
    assert config_copy.read_text() == Path(config.__file__).read_text()  # not recorded
    out = capsys.readouterr().out
    assert "LATEST_DOCKER_TAG not changed" in out and f'docker_tag="{plan.pinned_tag}"' in out


def test_two_builds_on_one_day_get_different_tags(checkout):
    repo, first = checkout
    (repo / "infra" / "note.txt").write_text("a change\n")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "second")
    second = _git(repo, "rev-parse", "--short", "HEAD")
    tags = [image.image_tags(commit, BUILD_TIME)[-1] for commit in (first, second)]
    assert tags == [f"20270305-{first}", f"20270305-{second}"] and first != second


def test_a_dirty_work_tree_is_refused_unless_allowed(checkout, tmp_path, monkeypatch, capsys):
    repo, commit = checkout
    (repo / "docker" / "marin" / "profile.sh").write_text("# edited, not committed\n")
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("docker", ["info"], stdout="28.2.2\n")
    assert cli.main(["build-image", "--no-push"]) == 2
    err = capsys.readouterr().err
    assert "uncommitted change" in err and "profile.sh" in err and "--allow-dirty" in err
    assert fake.calls() == []  # refused before docker was asked anything
    assert cli.main(["--dry-run", "build-image"]) == 2  # the preview says the same

    assert cli.main(["build-image", "--no-push", "--allow-dirty"]) == 0
    tagged = [argv[2] for argv in fake.argvs("docker") if argv[0] == "tag"]
    assert tagged[:3] == [f"us-central2-docker.pkg.dev/hai-gcp-models/marin/marin_cluster:{tag}"
                          for tag in ("latest", f"{commit}-dirty", f"20270305-{commit}-dirty")]  # fmt: skip


def test_build_image_stops_on_a_registry_error_other_than_not_found(checkout, tmp_path, monkeypatch):
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
        (["build-image", "--region", "us-central2", "--allow-dirty"], "docker, gcloud"),
        (["build-image", "--region", "us-central2", "--no-push", "--allow-dirty"], "docker,"),
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
    plan = image.plan_image(["us-central2"], "hai-gcp-models", allow_dirty=True)
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


GRANT = ["secrets", "add-iam-policy-binding", "RAY_AUTH_TOKEN", "--project=hai-gcp-models",
         "--member=serviceAccount:marin-ray@hai-gcp-models.iam.gserviceaccount.com",
         "--role=roles/secretmanager.secretAccessor"]  # fmt: skip


def test_init_auth_secret_dry_run(capsys, tmp_path):
    describe, generate, create, grant = printed_commands(capsys, "--cluster", "us-central2-staging", "--dry-run",
                                                         "init-auth-secret")  # fmt: skip
    assert describe == ["gcloud", "secrets", "describe", "RAY_AUTH_TOKEN_STAGING", "--project=hai-gcp-models",
                        "--format=value(name)"]  # fmt: skip
    assert generate[-4:] == ["get-auth-token", "--generate", ">", "/dev/null"]
    assert create[:6] == ["gcloud", "secrets", "create", "RAY_AUTH_TOKEN_STAGING", "--project=hai-gcp-models",
                          "--replication-policy=automatic"]  # fmt: skip
    assert create[6].startswith("--data-file=")
    assert grant == ["gcloud", *GRANT[:2], "RAY_AUTH_TOKEN_STAGING", *GRANT[3:]]


def test_the_grant_names_the_account_the_cluster_nodes_run_as():
    for spec in CLUSTERS.values():
        data = yaml.safe_load((config.infra_dir() / spec.config_file).read_text())
        nodes = data["available_node_types"]
        assert nodes["head_default"]["node_config"]["serviceAccounts"][0]["email"] == spec.service_account
        assert nodes["tpu_worker"]["node_config"]["serviceAccount"]["email"] == spec.service_account


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
    # then the cluster's nodes are allowed to read it (their setup_commands fetch it)
    assert [c["argv"] for c in fake.calls()][-1] == GRANT
    assert "secretAccessor" in out.out


def test_init_auth_secret_prints_the_grant_when_it_may_not_set_it(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["secrets", "describe"], stderr="NOT_FOUND: Secret [RAY_AUTH_TOKEN] not found\n", rc=1)
    fake.answer("gcloud", ["secrets", "add-iam-policy-binding"], stderr="PERMISSION_DENIED: setIamPolicy\n", rc=1)
    assert cli.main(["--cluster", "us-central2", "init-auth-secret"]) == 2
    err = capsys.readouterr().err
    assert "PERMISSION_DENIED" in err and shlex.join(["gcloud", *GRANT]) in err  # the exact command to hand on
    assert (tmp_path / "tokens" / "auth_token").is_file()  # the secret was created and installed all the same


def test_auth_points_to_init_when_the_secret_does_not_exist(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["secrets", "versions", "access"],
                stderr="ERROR: NOT_FOUND: Secret [projects/1/secrets/RAY_AUTH_TOKEN_STAGING] not found\n", rc=1)  # fmt: skip
    assert cli.main(["--cluster", "us-central2-staging", "auth"]) == 2
    err = capsys.readouterr().err
    assert "make init_ray_auth_token_secret CLUSTER=us-central2-staging" in err
    assert "marin cluster --cluster us-central2-staging init-auth-secret" in err
    fake.answer("gcloud", [], stderr="PERMISSION_DENIED: no access\n", rc=1)  # any other failure: said as it is
    fake.rules.reverse()
    fake.save()
    assert cli.main(["--cluster", "us-central2-staging", "auth"]) == 2
    err = capsys.readouterr().err
    assert "PERMISSION_DENIED" in err and "init_ray_auth_token_secret" not in err


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
    # add-worker --capacity best-effort: a queued resource holds the VM, under the same name
    {**_tpu("ray-worker-us-central2-v4-8-9a8b7c", "PREEMPTED"),
     "queuedResource": "projects/123/locations/us-central2-b/queuedResources/ray-worker-us-central2-v4-8-9a8b7c"},
]


def test_preempted_tpus_are_the_clusters_dead_vms_only():
    found = housekeeping.preempted_tpus(TPU_LIST, CLUSTERS["us-central2"])
    assert [(vm.name, vm.state) for vm in found] == [
        ("ray-marin-us-central2-worker-aaaa-tpu", "PREEMPTED"),
        ("ray-marin-us-central2-worker-cccc-tpu", "TERMINATED"),  # terminated VMs are included
        ("ray-worker-us-central2-v4-128-1a2b3c", "PREEMPTED"),
        ("ray-worker-us-central2-v4-8-9a8b7c", "PREEMPTED"),
    ]
    assert [vm.queued_resource for vm in found] == [None, None, None, "ray-worker-us-central2-v4-8-9a8b7c"]
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
    where = ["--zone=us-central2-b", "--project=hai-gcp-models"]
    assert printed == [
        ["gcloud", "compute", "tpus", "tpu-vm", "delete", name, *where, "--quiet", "--async"]
        for name in ("ray-marin-us-central2-worker-aaaa-tpu", "ray-marin-us-central2-worker-cccc-tpu",
                     "ray-worker-us-central2-v4-128-1a2b3c")
    ] + [["gcloud", "compute", "tpus", "queued-resources", "delete", "ray-worker-us-central2-v4-8-9a8b7c", *where,
          "--force", "--quiet", "--async"]]  # fmt: skip
    listed = [line for line in preview.out.splitlines() if line.startswith("#   ")]
    assert "PREEMPTED or TERMINATED" in preview.out and any("cccc" in l and "TERMINATED" in l for l in listed)
    assert "--yes" in preview.err

    assert cli.main(["--cluster", "us-central2", "clean-preempted-tpus", "--yes"]) == 0
    deleted = [argv for argv in fake.argvs("gcloud") if argv[3:4] == ["delete"]]
    assert deleted == [argv[1:] for argv in printed]  # exactly what the preview showed


def test_clean_preempted_tpus_tries_every_delete_and_reports_failures(tmp_path, monkeypatch, capsys):
    fake = FakeTools(tmp_path, monkeypatch)
    fake.answer("gcloud", ["compute", "tpus", "tpu-vm", "list"], stdout=json.dumps(TPU_LIST))
    fake.answer("gcloud", ["compute", "tpus", "tpu-vm", "delete", "ray-marin-us-central2-worker-aaaa-tpu"],
                stderr="ERROR: (gcloud.compute.tpus.tpu-vm.delete) INTERNAL: try again\n", rc=1)  # fmt: skip
    fake.answer("gcloud", ["compute", "tpus", "queued-resources", "delete"], stderr="ERROR: FAILED_PRECONDITION\n", rc=1)
    assert cli.main(["--cluster", "us-central2", "clean-preempted-tpus", "--yes"]) == 2
    deleted = [argv[4] for argv in fake.argvs("gcloud") if argv[3:4] == ["delete"]]
    assert deleted == ["ray-marin-us-central2-worker-aaaa-tpu", "ray-marin-us-central2-worker-cccc-tpu",
                       "ray-worker-us-central2-v4-128-1a2b3c", "ray-worker-us-central2-v4-8-9a8b7c"]  # fmt: skip
    err = capsys.readouterr().err
    assert "2 of 4 delete(s) failed" in err
    assert "ray-marin-us-central2-worker-aaaa-tpu (exit 1)" in err and "ray-worker-us-central2-v4-8-9a8b7c (exit 1)" in err


def test_clean_preempted_tpus_dry_run_and_local(capsys):
    listing, delete, delete_queued = printed_commands(capsys, "--cluster", "big-run", "--dry-run",
                                                      "clean-preempted-tpus")  # fmt: skip
    assert delete_queued[:6] == ["gcloud", "compute", "tpus", "queued-resources", "delete", "<queued-resource>"]
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
        ("cluster_docker", "cluster build-image --project hai-gcp-models --region us-central2 --region us-west4 "
                           "--region europe-west4 --region us-east5 --region us-east1 --region us-central1"),
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
        f"gcloud artifacts repositories set-cleanup-policies marin --location={region} --project=hai-gcp-models "
        "--policy=infra/artifact-registry-cleanup-policy.json --no-dry-run"
        for region in ("us-central2", "europe-west4")
    ]
    run = make("configure_gcp_registry_all", "DRY_RUN=1", "CLUSTER_REPOS=us-east5", "PROJECT=other-project")
    assert "--location=us-east5 --project=other-project " in run.stdout, run.stderr
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
