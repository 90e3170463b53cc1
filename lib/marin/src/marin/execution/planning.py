"""From the steps a user lists to a plan: every step once, versioned, in dependency order.

Planning reads nothing from storage. It walks the dependencies of the given steps, computes
each step's version and output path (see `hashing`), folds identical steps (same output
path) into one, applies `run_only`, and orders steps so dependencies come first. A step
referred to only through `.nonblocking()` gets a version and an output path (its
dependents need them) but is not part of the plan's steps: nothing waits for it or runs it.
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass, field
from typing import Any, Iterable

from marin.execution.hashing import dependencies_of, hash_version, pseudo_dependencies_of, version_of
from marin.execution.steps import ExecutorStep, InputName, get_executor_step

__all__ = ["PlannedStep", "Plan", "plan_steps", "output_path_for"]

logger = logging.getLogger(__name__)


@dataclass
class PlannedStep:
    """A step with its version, hash, output path and the output paths it depends on."""

    step: ExecutorStep
    version: dict[str, Any]
    hash: str
    output_path: str
    dependencies: list[str] = field(default_factory=list)

    @property
    def name(self) -> str:
        return self.step.name

    @property
    def version_id(self) -> str:
        """`<name>-<hash>`, plus `@<override>` for a step with `override_output_path`, so
        that a dependency's override counts in its dependents' versions."""
        override = self.step.override_output_path
        base = f"{self.step.name}-{self.hash}"
        return f"{base}@{override}" if override else base


@dataclass
class Plan:
    """The planned steps in dependency order, and a lookup from steps to their plan entry
    (which also covers steps referred to only through `.nonblocking()`)."""

    steps: list[PlannedStep]
    by_step: dict[int, PlannedStep]
    prefix: str | None = None

    def output_path(self, step: ExecutorStep) -> str:
        return self.by_step[id(step)].output_path


def output_path_for(prefix: str, step: ExecutorStep, step_hash: str) -> str:
    """`<prefix>/<name>-<hash>`, or the step's override (taken under the prefix if relative)."""
    prefix = prefix.rstrip("/")
    override = step.override_output_path
    if override:
        return override.rstrip("/") if "://" in override or override.startswith("/") else f"{prefix}/{override.strip('/')}"
    return f"{prefix}/{step.name}-{step_hash}"


def plan_steps(steps: Iterable[ExecutorStep | InputName], prefix: str, run_only: list[str] | None = None) -> Plan:
    """Plan `steps` (steps, or references to steps) and all their dependencies under `prefix`.

    Raises:
        ValueError: an entry is neither a step nor a reference to one (`get_executor_step`),
            a dependency cycle, or a `run_only` pattern that matches no step.
    """
    by_step: dict[int, PlannedStep] = {}
    by_path: dict[str, PlannedStep] = {}
    order: list[PlannedStep] = []
    visiting: set[int] = set()

    def visit(step: ExecutorStep) -> PlannedStep:
        if not isinstance(step, ExecutorStep):
            raise TypeError(f"expected ExecutorStep, got {type(step).__name__}: {step!r}")
        if id(step) in by_step:
            return by_step[id(step)]
        if id(step) in visiting:
            raise ValueError(f"dependency cycle through step {step.name!r}")
        visiting.add(id(step))
        deps = [visit(dep) for dep in dependencies_of(step)]
        for pseudo in pseudo_dependencies_of(step):
            visit(pseudo)
        visiting.discard(id(step))
        version = version_of(step, lambda dep: by_step[id(dep)].version_id)
        step_hash = hash_version(version)
        path = output_path_for(prefix, step, step_hash)
        planned = by_path.get(path)
        if planned is None:
            planned = PlannedStep(step, version, step_hash, path, list(dict.fromkeys(d.output_path for d in deps)))
            by_path[path] = planned
            order.append(planned)
        elif planned.version != version:
            raise ValueError(f"steps {planned.name!r} and {step.name!r} differ in version but share output path {path}")
        by_step[id(step)] = planned
        return planned

    roots = [get_executor_step(entry) for entry in steps]
    for step in roots:
        visit(step)
    order = _needed(order, by_path, [by_step[id(step)].output_path for step in roots])
    if run_only:
        order = _select(order, by_path, run_only)
    return Plan(order, by_step, prefix.rstrip("/"))


def _closure(by_path: dict[str, PlannedStep], start: Iterable[str]) -> set[str]:
    """`start` and every step they need (blocking dependencies), transitively."""
    wanted: set[str] = set()
    stack = list(start)
    while stack:
        path = stack.pop()
        if path not in wanted:
            wanted.add(path)
            stack.extend(by_path[path].dependencies)
    return wanted


def _needed(order: list[PlannedStep], by_path: dict[str, PlannedStep], roots: list[str]) -> list[PlannedStep]:
    """Drop the steps referred to only through `.nonblocking()` references."""
    wanted = _closure(by_path, roots)
    return [p for p in order if p.output_path in wanted]


def _select(order: list[PlannedStep], by_path: dict[str, PlannedStep], patterns: list[str]) -> list[PlannedStep]:
    """The steps whose names match any pattern (re.search), plus everything they depend on."""
    matched: list[str] = []
    for pattern in patterns:
        matches = [p for p in order if re.search(pattern, p.name)]
        if not matches:
            names = ", ".join(sorted({p.name for p in order}))
            raise ValueError(f"run_only pattern {pattern!r} matches no step; the steps are: {names}")
        matched.extend(p.output_path for p in matches)
    wanted = _closure(by_path, matched)
    return [p for p in order if p.output_path in wanted]
