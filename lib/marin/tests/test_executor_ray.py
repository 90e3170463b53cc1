"""Steps as Ray tasks: remote functions keep their options; `resources` become Ray options."""

from __future__ import annotations

import json
import os
from dataclasses import dataclass

import pytest

from marin.execution import (
    Executor,
    ExecutorError,
    ExecutorStep,
    optional_dependency_groups,
    output_path_of,
    pip_runtime_env,
    this_output_path,
    versioned,
)
from marin.execution.ray_env import ray_options


@dataclass(frozen=True)
class Cfg:
    value: object
    output_path: object
    input_path: object = None


def describe_worker(config: Cfg) -> None:
    """Write where and with which resources the step ran."""
    import ray

    in_task = ray.get_runtime_context().get_task_id() is not None
    resources = ray.get_runtime_context().get_assigned_resources() if in_task else None
    os.makedirs(config.output_path, exist_ok=True)
    with open(f"{config.output_path}/where.json", "w") as f:
        json.dump(
            {"pid": os.getpid(), "value": config.value, "resources": resources, "input": config.input_path},
            f,
        )


@pytest.mark.ray
def test_ray_remote_and_resource_steps_run_as_ray_tasks(ray_shared, tmp_path):
    remote = ray_shared.remote(num_cpus=1)(describe_worker)
    a = ExecutorStep("remote", remote, Cfg(versioned(1), this_output_path()))
    b = ExecutorStep(
        "plain-with-resources", describe_worker, Cfg(versioned(2), this_output_path(), output_path_of(a)), resources={"num_cpus": 2}
    )
    c = ExecutorStep("plain-in-thread", describe_worker, Cfg(versioned(3), this_output_path(), output_path_of(b)))
    result = Executor(str(tmp_path), poll_interval=0.05).run([c])
    where = [json.load(open(f"{path}/where.json")) for path in result]
    assert where[0]["pid"] != os.getpid() and where[0]["resources"].get("CPU") == 1
    assert where[1]["pid"] != os.getpid() and where[1]["resources"].get("CPU") == 2
    assert where[1]["input"] == list(result)[0]
    assert where[2]["pid"] == os.getpid()  # a plain function without resources runs in a thread


def write_env(config: Cfg) -> None:
    os.makedirs(config.output_path, exist_ok=True)
    with open(f"{config.output_path}/env.json", "w") as f:
        json.dump({name: os.environ.get(name) for name in ("FROM_DECORATOR", "FROM_STEP")}, f)


@pytest.mark.ray
def test_a_remote_functions_own_runtime_env_is_kept_when_the_step_adds_one(ray_shared, tmp_path):
    """Regression: the step's runtime_env (from `resources` or pip groups) went to Ray's
    `.options()`, which replaces the decorator's runtime_env outright: its env vars (and pip
    packages) were silently dropped."""
    remote = ray_shared.remote(num_cpus=1, runtime_env={"env_vars": {"FROM_DECORATOR": "kept"}})(write_env)
    step = ExecutorStep("env", remote, Cfg(versioned(1), this_output_path()),
                        resources={"runtime_env": {"env_vars": {"FROM_STEP": "added"}}})
    (path,) = Executor(str(tmp_path), poll_interval=0.05).run([step])
    assert json.load(open(f"{path}/env.json")) == {"FROM_DECORATOR": "kept", "FROM_STEP": "added"}


@pytest.mark.ray
def test_failure_inside_a_ray_task_fails_the_step(ray_shared, tmp_path):
    @ray_shared.remote(max_retries=0)
    def explode(config):
        raise RuntimeError("remote boom")

    with pytest.raises(ExecutorError, match="remote boom"):
        Executor(str(tmp_path)).run([ExecutorStep("explode", explode, {"v": versioned(1)})])


def test_pip_dependency_groups_become_a_runtime_env(tmp_path):
    (tmp_path / "pyproject.toml").write_text(
        '[project]\nname = "x"\n[project.optional-dependencies]\ndedup = ["datasketch>=1.5", "numpy"]\n'
        '[tool.uv.workspace]\nmembers = ["lib/*"]\n'
    )
    (tmp_path / "lib" / "m").mkdir(parents=True)
    (tmp_path / "lib" / "m" / "pyproject.toml").write_text('[project]\nname = "m"\n[project.optional-dependencies]\ntpu = ["jax"]\n')
    assert optional_dependency_groups(tmp_path / "pyproject.toml") == {"dedup": ["datasketch>=1.5", "numpy"], "tpu": ["jax"]}
    env = pip_runtime_env(["dedup", "tpu", "google-cloud-logging", "numpy"], tmp_path / "pyproject.toml")
    assert env == {"pip": ["datasketch>=1.5", "numpy", "jax", "google-cloud-logging"]}
    assert pip_runtime_env(None) == {}
    with pytest.raises(TypeError, match="list"):
        pip_runtime_env("dedup")


def test_ray_options_merge_resources_and_pip(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[project.optional-dependencies]\ng = ["a", "b"]\n')
    monkeypatch.chdir(tmp_path)
    options = ray_options("step", {"num_cpus": 4, "runtime_env": {"env_vars": {"K": "V"}}}, ["g", "c"])
    assert options == {"num_cpus": 4, "name": "step", "runtime_env": {"env_vars": {"K": "V"}, "pip": ["a", "b", "c"]}}


def test_ray_options_merge_into_the_decorators_runtime_env(monkeypatch, tmp_path):
    (tmp_path / "pyproject.toml").write_text('[project]\nname = "x"\n[project.optional-dependencies]\ng = ["a", "b"]\n')
    monkeypatch.chdir(tmp_path)
    # Ray keeps a decorator's pip list as {"packages": [...], ...}
    base = {"env_vars": {"A": "1", "B": "1"}, "pip": {"packages": ["x", "a"], "pip_check": False}, "working_dir": "w"}
    options = ray_options("step", {"runtime_env": {"env_vars": {"B": "2"}}}, ["g"], base)
    assert options["runtime_env"] == {
        "env_vars": {"A": "1", "B": "2"}, "pip": {"packages": ["x", "a", "b"], "pip_check": False}, "working_dir": "w"}
    assert ray_options("step", None, None, base) == {"name": "step"}  # nothing to add: the decorator's env stays
    with pytest.raises(ValueError, match="requirements.txt"):
        ray_options("step", {"runtime_env": {"pip": "requirements.txt"}}, ["g"])
