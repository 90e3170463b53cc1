"""The Makefile's token targets against a real local cluster (token auth on), never printing the token.

`make get_ray_auth_token CLUSTER=local` runs the same `marin cluster ... auth` as for a cloud
cluster; `auth-env` then lets Ray's own CLI through the cluster's token check, and without it
the same CLI is refused. Every output is searched for the token string.
"""

from __future__ import annotations

import os
import shlex
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from marin.cluster import local

ROOT = Path(__file__).resolve().parents[3]

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(shutil.which("make") is None, reason="needs make"),
]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    """A local cluster in a private HOME and state dir; stopped even when a test fails."""
    base = tmp_path_factory.mktemp("tokens")
    home, state = base / "home", base / "local"
    home.mkdir()
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env.update(HOME=str(home), MARIN_LOCAL_CLUSTER_DIR=str(state), MARIN_TOKEN_DIR=str(home / ".ray"),
               RAY_ENABLE_UV_RUN_RUNTIME_ENV="0")  # fmt: skip
    env.pop("MARIN_CLUSTER", None)
    running = local.start(state, num_cpus=1)
    try:
        yield running, env, local.token_path(state).read_text().strip()
    finally:
        local.stop(state)


def run(argv: list[str], env: dict) -> subprocess.CompletedProcess:
    return subprocess.run(argv, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)


def make(target: str, env: dict, *args: str) -> subprocess.CompletedProcess:
    return run(["make", "--no-print-directory", target, f"MARIN={sys.executable} -m marin.cli", *args], env)


def test_get_ray_auth_token_names_the_token_file_and_never_prints_the_token(cluster):
    running, env, token = cluster
    result = make("get_ray_auth_token", env, "CLUSTER=local")
    assert result.returncode == 0, result.stderr
    assert str(running.token_path) in result.stdout and running.dashboard_url in result.stdout
    assert token not in result.stdout + result.stderr


def test_auth_env_lets_rays_own_cli_through_and_nothing_else_does(cluster):
    running, env, token = cluster
    lines = run([sys.executable, "-m", "marin.cli", "cluster", "--cluster", "local", "auth-env"], env)
    assert lines.returncode == 0 and token not in lines.stdout
    exported = dict(shlex.split(line.removeprefix("export "))[0].split("=", 1) for line in lines.stdout.splitlines())
    assert exported["RAY_AUTH_MODE"] == "token" and exported["RAY_ADDRESS"] == running.dashboard_url

    ray_cli = [sys.executable, "-m", "ray.scripts.scripts", "job", "list", "--address", running.dashboard_url]
    allowed = run(ray_cli, {**env, **exported})
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    refused = run(ray_cli, env)  # no token in the environment, none under HOME
    assert refused.returncode != 0
    assert "auth" in refused.stderr.lower() or "401" in refused.stderr, refused.stderr[-2000:]
    for result in (allowed, refused):
        assert token not in result.stdout + result.stderr


def test_cloud_only_token_targets_refuse_the_local_cluster_clearly(cluster):
    _, env, token = cluster
    result = make("init_ray_auth_token_secret", env, "CLUSTER=local")
    assert result.returncode != 0
    assert "`init-auth-secret` is for cloud clusters" in result.stderr
    assert token not in result.stdout + result.stderr
