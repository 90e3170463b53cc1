"""Running a step's function: in a thread, or as a Ray task with its own environment.

A plain function runs in the executor's own thread: cheap, and enough for steps that only
orchestrate (a Zephyr pipeline submits its own Ray tasks). A Ray remote function, or any
step with `resources` or `pip_dependency_groups`, runs as one Ray task with those options.

`pip_dependency_groups` names either a group of `[project.optional-dependencies]` in the
project's pyproject.toml (the nearest one above the working directory, and the members of
its uv workspace) or a pip requirement string; they become the task's `runtime_env["pip"]`.
Ray is imported only when a step needs it.
"""

from __future__ import annotations

import glob
import logging
import os
import sys
import tomllib
from pathlib import Path
from typing import Any, Callable

from zephyr.execution.interrupts import ThreadInterrupter

__all__ = ["is_ray_remote", "optional_dependency_groups", "pip_runtime_env", "ray_cancel_grace", "run_step_function"]


def is_ray_remote(fn: Any) -> bool:
    """True for a function decorated with `@ray.remote` (without importing Ray)."""
    ray = sys.modules.get("ray")
    if ray is None:
        return False
    from ray.remote_function import RemoteFunction

    return isinstance(fn, RemoteFunction)


def _find_pyproject(start: Path) -> Path | None:
    for directory in (start, *start.parents):
        candidate = directory / "pyproject.toml"
        if candidate.is_file():
            return candidate
    return None


def optional_dependency_groups(pyproject: str | os.PathLike | None = None) -> dict[str, list[str]]:
    """Optional-dependency groups of the project: `{group: [requirement, ...]}`.

    Reads `pyproject` (default: the nearest pyproject.toml above the working directory) and
    the pyproject.toml of every member of its `[tool.uv.workspace]`; the first definition
    of a group name wins.
    """
    path = Path(pyproject) if pyproject else _find_pyproject(Path.cwd())
    if path is None:
        return {}
    root = tomllib.loads(path.read_text())
    documents = [root]
    for pattern in root.get("tool", {}).get("uv", {}).get("workspace", {}).get("members", []):
        for member in sorted(glob.glob(str(path.parent / pattern))):
            member_toml = Path(member) / "pyproject.toml"
            if member_toml.is_file():
                documents.append(tomllib.loads(member_toml.read_text()))
    groups: dict[str, list[str]] = {}
    for document in documents:
        for name, requirements in document.get("project", {}).get("optional-dependencies", {}).items():
            groups.setdefault(name, list(requirements))
    return groups


def pip_runtime_env(pip_dependency_groups: list[str] | None, pyproject: str | os.PathLike | None = None) -> dict[str, Any]:
    """The Ray `runtime_env` for a step: `{"pip": [...]}`, or `{}` when nothing is needed.

    Each entry is a group name (expanded to its requirements) or else a requirement string.
    Example: `pip_runtime_env(["tpu", "google-cloud-logging"])`
    -> `{"pip": ["jax>=0.4.30", "optax>=0.2", "google-cloud-logging"]}`.
    """
    if not pip_dependency_groups:
        return {}
    if isinstance(pip_dependency_groups, str):
        raise TypeError(f"pip_dependency_groups must be a list of names, got the string {pip_dependency_groups!r}")
    groups = optional_dependency_groups(pyproject)
    packages: list[str] = []
    for entry in pip_dependency_groups:
        for requirement in groups.get(entry, [entry]):
            if requirement not in packages:
                packages.append(requirement)
    return {"pip": packages}


def ray_options(
    name: str,
    resources: dict[str, Any] | None,
    pip_dependency_groups: list[str] | None,
    base_runtime_env: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Ray task options for a step: its `resources`, a task name, and the pip runtime env.

    `base_runtime_env` is the one a `@ray.remote(runtime_env=...)` decorator gave the step's
    function. Ray's `.options(runtime_env=...)` replaces that one outright, so it is merged in
    here as Ray merges a job's and a task's: the step's fields win, `env_vars` are merged by
    name, and the pip groups are added to the pip packages.
    """
    options = dict(resources or {})
    options.setdefault("name", name)
    env = pip_runtime_env(pip_dependency_groups)
    step_env = dict(options.get("runtime_env") or {})
    if not env and not step_env:
        return options  # no runtime_env option: the decorator's (if any) stays as it is
    base = dict(base_runtime_env or {})
    runtime_env = {**base, **step_env}
    if base.get("env_vars") and step_env.get("env_vars"):
        runtime_env["env_vars"] = {**base["env_vars"], **step_env["env_vars"]}
    if env:
        runtime_env["pip"] = _with_packages(runtime_env.get("pip"), env["pip"], name)
    options["runtime_env"] = runtime_env
    return options


def _with_packages(pip: Any, packages: list[str], name: str) -> Any:
    """A runtime_env `pip` field (a list, or Ray's `{"packages": [...], ...}`) with `packages` added."""
    if not pip:
        return list(packages)
    if isinstance(pip, dict) and isinstance(pip.get("packages"), list):
        return {**pip, "packages": pip["packages"] + [p for p in packages if p not in pip["packages"]]}
    if isinstance(pip, list):
        return pip + [p for p in packages if p not in pip]
    raise ValueError(
        f"step {name!r}: cannot add pip_dependency_groups to the runtime_env pip field {pip!r}; "
        "give the packages as a list there, or in pip_dependency_groups alone"
    )


def _decorator_runtime_env(fn: Any) -> dict[str, Any] | None:
    """The runtime_env of `@ray.remote(runtime_env=...)` on `fn` (Ray keeps it in `_default_options`)."""
    return (getattr(fn, "_default_options", None) or {}).get("runtime_env")


CANCEL_GRACE = 3.0  # seconds a cancelled step task gets to stop before its worker is killed (by default)


def run_step_function(
    fn: Callable[[Any], Any],
    config: Any,
    name: str,
    resources: dict[str, Any] | None = None,
    pip_dependency_groups: list[str] | None = None,
    interrupter: ThreadInterrupter | None = None,
    cancel_grace: float = CANCEL_GRACE,
) -> Any:
    """Call `fn(config)` where the step asks: this thread, or a Ray task (waited for).

    With an `interrupter`, `interrupter.interrupt()` from another thread stops the call: an
    exception raised inside a local function, or `ray.cancel` of the step's Ray task (and the
    tasks it started) followed, if it has not ended within `cancel_grace` seconds, by a forced
    cancel that kills its worker (the executor passes most of its `interrupt_grace`: a
    `KeyboardInterrupt` can take seconds to reach a task on a busy node, and a forced cancel
    skips the task's `finally` blocks).
    """
    interrupter = interrupter or ThreadInterrupter()
    remote = is_ray_remote(fn)
    if not remote and not resources and not pip_dependency_groups:
        return interrupter.call(fn, config)
    import ray

    task = fn if remote else ray.remote(fn)
    base = _decorator_runtime_env(fn) if remote else None
    ref = task.options(**ray_options(name, resources, pip_dependency_groups, base)).remote(config)
    try:
        interrupter.call(_wait_for, ray, ref)
    except BaseException:
        if interrupter.interrupted:
            _cancel(ray, ref, cancel_grace)
        raise
    return ray.get(ref)




def ray_cancel_grace(interrupt_grace: float) -> float:
    """How long an interrupted Ray step's task may take to stop on its `KeyboardInterrupt`
    before its worker is killed: most of the executor's `interrupt_grace`, leaving a fifth (at
    most 2 s) for the forced cancel to land before the executor stops waiting for the step."""
    return max(0.0, interrupt_grace - min(2.0, interrupt_grace / 5))


def _wait_for(ray: Any, ref: Any) -> None:
    """Wait for `ref` in short slices, so that an interrupt raised in this thread lands promptly."""
    while not ray.wait([ref], timeout=0.2)[0]:
        pass


def _cancel(ray: Any, ref: Any, grace: float) -> None:
    """Cancel the step's task and its children; kill its worker if it does not stop in `grace` seconds."""
    try:
        ray.cancel(ref, recursive=True)
        if not ray.wait([ref], timeout=grace)[0]:
            logging.getLogger(__name__).warning(
                "the cancelled Ray task of a step did not stop within %.1fs; killing its worker", grace)
            ray.cancel(ref, force=True, recursive=True)
    except Exception:  # noqa: BLE001 - it ended meanwhile, or Ray is going away
        logging.getLogger(__name__).warning("cancelling the Ray task of a step failed", exc_info=True)
