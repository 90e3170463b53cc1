"""The vocabulary of an experiment: steps and the placeholders a step's config may hold.

An `ExecutorStep` is a name, a function and a config (a dataclass, the function's single
argument). The config is written with placeholders that the executor replaces by concrete
values just before the function runs:

- `output_path_of(step, subpath)` (or the step itself): that step's output path, which makes
  the step a dependency;
- `InputName.hardcoded(path)`: a path to data that no step produced;
- `this_output_path(subpath)`: the running step's own output path;
- `versioned(value)`: a plain value that counts in the step's version (see `hashing`).

Nothing here runs anything or touches storage; these are plain records.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

__all__ = [
    "ExecutorStep",
    "InputName",
    "OutputName",
    "VersionedValue",
    "output_path_of",
    "this_output_path",
    "versioned",
]

ConfigT = TypeVar("ConfigT")
T = TypeVar("T")


@dataclass(eq=False)
class ExecutorStep(Generic[ConfigT]):
    """One node of an experiment DAG: `fn(config)` writes its output under its output path.

    Args:
        name: identifies what the step computes, e.g. "hello_world/numbers"; the first part
            of its output directory name. Counts in the version.
        fn: a plain function (runs in a thread of the executor process) or a Ray remote
            function (runs as a Ray task with its own options). Does NOT count in the version.
        config: the single argument of `fn`, usually a dataclass holding placeholders.
        description: free text, recorded in the info file.
        pip_dependency_groups: optional-dependency group names of the project's
            pyproject.toml, or pip requirement strings, installed in the step's Ray runtime
            environment (see `ray_env`).
        override_output_path: use this output path instead of `<prefix>/<name>-<hash>`;
            relative paths are taken under the prefix.
        resources: Ray task options (`num_cpus`, `num_gpus`, `memory`, `resources`, ...).
            A plain function with resources or pip groups runs as a Ray task too.

    Steps compare by identity; two distinct steps with the same output path are run once.
    """

    name: str
    fn: Callable[[ConfigT], Any]
    config: ConfigT
    description: str | None = None
    pip_dependency_groups: list[str] | None = None
    override_output_path: str | None = None
    resources: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"ExecutorStep name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"ExecutorStep {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if self.resources is not None and not isinstance(self.resources, dict):
            raise TypeError(f"ExecutorStep {self.name!r}: resources must be a dict of Ray options, got {self.resources!r}")

    def cd(self, subpath: str) -> InputName:
        """A reference to `subpath` under this step's output path (same as `output_path_of`)."""
        return InputName(step=self, subpath=subpath)

    def __truediv__(self, subpath: str) -> InputName:
        return self.cd(subpath)


@dataclass(frozen=True)
class InputName:
    """A path an input comes from: under a step's output path, or a hardcoded location.

    Exactly one of `step` and `path` is set. Resolves to a string path at run time.
    """

    step: ExecutorStep | None = None
    subpath: str | None = None
    path: str | None = None

    def __post_init__(self) -> None:
        if (self.step is None) == (self.path is None):
            raise ValueError("InputName needs exactly one of step= or path= (use output_path_of or InputName.hardcoded)")

    @staticmethod
    def hardcoded(path: str) -> InputName:
        """A path to data outside the executor (e.g. a raw corpus); counts in the version."""
        if not isinstance(path, str) or not path:
            raise ValueError(f"InputName.hardcoded needs a non-empty path string, got {path!r}")
        return InputName(path=path)

    def cd(self, subpath: str) -> InputName:
        """The same input, `subpath` further down."""
        joined = _join(self.subpath, subpath)
        if self.step is not None:
            return InputName(step=self.step, subpath=joined)
        return InputName(path=_join(self.path, subpath))

    def __truediv__(self, subpath: str) -> InputName:
        return self.cd(subpath)


@dataclass(frozen=True)
class OutputName:
    """The running step's own output path (plus `subpath`); see `this_output_path`."""

    subpath: str | None = None


@dataclass(frozen=True)
class VersionedValue(Generic[T]):
    """A config value that counts in the step's version; see `versioned`."""

    value: T


def output_path_of(step: ExecutorStep, subpath: str | None = None) -> InputName:
    """Refer to `step`'s output path (or `subpath` under it); `step` becomes a dependency.

    Example: `StatsConfig(input_path=output_path_of(numbers, "numbers.json"))`.
    """
    if not isinstance(step, ExecutorStep):
        raise TypeError(f"output_path_of expects an ExecutorStep, got {type(step).__name__}")
    return InputName(step=step, subpath=subpath)


def this_output_path(subpath: str | None = None) -> OutputName:
    """Refer to the output path of the step whose config holds this placeholder."""
    return OutputName(subpath=subpath)


def versioned(value: T) -> VersionedValue[T]:
    """Mark `value` as part of the step's version: changing it changes the output path.

    The value must be JSON-serialisable (numbers, strings, bools, None, lists, dicts).
    """
    if isinstance(value, (VersionedValue, InputName, OutputName, ExecutorStep)):
        raise TypeError(f"versioned() takes a plain value, got {type(value).__name__}")
    return VersionedValue(value)


def _join(base: str | None, subpath: str | None) -> str | None:
    if not subpath:
        return base
    if not base:
        return subpath
    return base.rstrip("/") + "/" + subpath.lstrip("/")


def is_dataclass_instance(obj: Any) -> bool:
    """True for dataclass instances (not classes)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
