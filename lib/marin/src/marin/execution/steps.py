"""The vocabulary of an experiment: steps and the placeholders a step's config may hold.

An `ExecutorStep` is a name, a function and a config (a dataclass, the function's single
argument). The config is written with placeholders that the executor replaces by concrete
values just before the function runs:

- `output_path_of(step, name)`, `step / "name"`, `step.cd("name")` (or the step itself):
  that step's output path, which makes the step a dependency; `.nonblocking()` on such a
  reference keeps it in the version without waiting for (or running) the step;
- `InputName.hardcoded(path)`: a path to data that no step produced (relative paths are
  taken under the executor's prefix);
- `this_output_path(name)` / `THIS_OUTPUT_PATH`: the running step's own output path;
- `versioned(value)`: a plain value that counts in the step's version (see `hashing`).

Nothing here runs anything or touches storage; these are plain records. The names and
behaviour follow Marin's `marin.execution.executor`, so existing experiments run unchanged.
"""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from typing import Any, Callable, Generic, TypeVar

__all__ = [
    "THIS_OUTPUT_PATH",
    "ExecutorStep",
    "InputName",
    "OutputName",
    "VersionedValue",
    "ensure_versioned",
    "get_executor_step",
    "output_path_of",
    "this_output_path",
    "unwrap_versioned_value",
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
        override_output_path: use this output path instead of `<prefix>/<name>-<hash>`;
            relative paths are taken under the prefix.
        pip_dependency_groups: optional-dependency group names of the project's
            pyproject.toml, or pip requirement strings, installed in the step's Ray runtime
            environment (see `ray_env`).
        resources: Ray task options (`num_cpus`, `num_gpus`, `memory`, `resources`, ...).
            A plain function with resources or pip groups runs as a Ray task too.

    Steps compare by identity; two distinct steps with the same output path are run once.
    """

    name: str
    fn: Callable[[ConfigT], Any]
    config: ConfigT
    description: str | None = None
    override_output_path: str | None = None
    pip_dependency_groups: list[str] | None = None
    resources: dict[str, Any] | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not self.name.strip():
            raise ValueError(f"ExecutorStep name must be a non-empty string, got {self.name!r}")
        if not callable(self.fn):
            raise TypeError(f"ExecutorStep {self.name!r}: fn must be callable, got {type(self.fn).__name__}")
        if self.resources is not None and not isinstance(self.resources, dict):
            raise TypeError(f"ExecutorStep {self.name!r}: resources must be a dict of Ray options, got {self.resources!r}")

    def cd(self, name: str) -> InputName:
        """A reference to `name` under this step's output path (same as `output_path_of(step, name)`)."""
        return InputName(self, name)

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def with_output_path(self, output_path: str) -> ExecutorStep[ConfigT]:
        """A copy of this step that writes to `output_path` (its `override_output_path`)."""
        return dataclasses.replace(self, override_output_path=output_path)

    def as_input_name(self) -> InputName:
        """A reference to this step's whole output path."""
        return InputName(self)


@dataclass(frozen=True, init=False)
class InputName:
    """A path an input comes from: `name` under a step's output path, or a hardcoded path.

    `InputName(step, name)` refers to `<step's output path>/<name>`; with `step=None`,
    `name` is a path outside the pipeline (see `hardcoded`). `block_on_step=False` (see
    `nonblocking`) keeps the step in the version but neither waits for nor runs it.
    Also accepted: `InputName(step=s, subpath=...)` and `InputName(path=..., subpath=...)`.
    Resolves to a string path at run time.
    """

    step: ExecutorStep | None
    name: str | None
    block_on_step: bool

    def __init__(
        self,
        step: ExecutorStep | None = None,
        name: str | None = None,
        block_on_step: bool = True,
        *,
        subpath: str | None = None,
        path: str | None = None,
    ) -> None:
        if path is not None:
            if step is not None or name is not None:
                raise ValueError("InputName takes path= (a hardcoded location) or step=/name=, not both")
            name = join_path(path, subpath)
        elif subpath is not None:
            if name is not None:
                raise ValueError("InputName takes name= or subpath= (the same thing), not both")
            name = subpath
        if step is not None and not isinstance(step, ExecutorStep):
            raise TypeError(f"InputName step must be an ExecutorStep, got {type(step).__name__}")
        if step is None and not name:
            raise ValueError("InputName needs a step or a path (use output_path_of(step) or InputName.hardcoded(path))")
        object.__setattr__(self, "step", step)
        object.__setattr__(self, "name", name or None)
        object.__setattr__(self, "block_on_step", bool(block_on_step))

    @property
    def subpath(self) -> str | None:
        """The part under the step's output path (None for a hardcoded path)."""
        return self.name if self.step is not None else None

    @property
    def path(self) -> str | None:
        """The hardcoded path (None when the input comes from a step)."""
        return self.name if self.step is None else None

    @staticmethod
    def hardcoded(path: str) -> InputName:
        """A path to data outside the executor (e.g. a raw corpus); counts in the version.

        A relative path is taken under the executor's prefix.
        """
        if not isinstance(path, str) or not path:
            raise ValueError(f"InputName.hardcoded needs a non-empty path string, got {path!r}")
        return InputName(None, path)

    def cd(self, name: str) -> InputName:
        """The same input, `name` further down."""
        return InputName(self.step, join_path(self.name, name), self.block_on_step)

    def __truediv__(self, name: str) -> InputName:
        return self.cd(name)

    def nonblocking(self) -> InputName:
        """This reference without the wait: the step still counts in the version, but the
        referring step neither waits for it nor runs it (e.g. reading a checkpoint of a
        training run that is still going). A step that another step needs normally still runs."""
        return dataclasses.replace(self, block_on_step=False)


@dataclass(frozen=True)
class OutputName:
    """The running step's own output path (plus `name`); see `this_output_path`."""

    name: str | None = None

    @property
    def subpath(self) -> str | None:
        return self.name


THIS_OUTPUT_PATH = OutputName(None)
"""`this_output_path()` as a constant, for dataclass field defaults."""


@dataclass(frozen=True)
class VersionedValue(Generic[T]):
    """A config value that counts in the step's version; see `versioned`."""

    value: T


def output_path_of(step: ExecutorStep, name: str | None = None) -> InputName:
    """Refer to `step`'s output path (or `name` under it); `step` becomes a dependency.

    Example: `StatsConfig(input_path=output_path_of(numbers, "numbers.json"))`.
    """
    if not isinstance(step, ExecutorStep):
        raise TypeError(f"output_path_of expects an ExecutorStep, got {type(step).__name__}")
    return InputName(step, name)


def get_executor_step(run: ExecutorStep | InputName) -> ExecutorStep:
    """The step itself, or the step a reference (`step / "sub"`, `output_path_of(step)`) points to.

    Raises ValueError (as Marin's does) for a hardcoded path, which is no step, and for
    anything that is neither a step nor a reference.
    """
    if isinstance(run, ExecutorStep):
        return run
    if isinstance(run, InputName):
        if run.step is None:
            raise ValueError(f"hardcoded path {run.path!r} is not a step of the pipeline")
        return run.step
    raise ValueError(f"expected an ExecutorStep or a step reference (InputName), got {type(run).__name__}: {run!r:.100}")


def this_output_path(name: str | None = None) -> OutputName:
    """Refer to the output path of the step whose config holds this placeholder."""
    return OutputName(name)


_PLACEHOLDERS = (VersionedValue, InputName, OutputName, ExecutorStep)


def versioned(value: T) -> VersionedValue[T]:
    """Mark `value` as part of the step's version: changing it changes the output path.

    The value must be JSON-serialisable (numbers, strings, bools, None, lists, dicts).

    Raises:
        ValueError: `value` is (or contains) another placeholder: `versioned(versioned(x))`,
            or a step reference, which already counts in the version by itself.
    """
    where = _placeholder_inside(value, "")
    if where is not None:
        at, found = where
        location = f" (at {at})" if at else ""
        if isinstance(found, VersionedValue):
            raise ValueError(f"versioned() cannot be nested: {found!r}{location} is already versioned; use ensure_versioned")
        raise ValueError(
            f"versioned() takes a plain value, got a {type(found).__name__}{location}: step references count in "
            "the version by themselves, so put them in the config without versioned()"
        )
    return VersionedValue(value)


def ensure_versioned(value: VersionedValue[T] | T) -> VersionedValue[T]:
    """`value` if it is already versioned, else `versioned(value)`."""
    return value if isinstance(value, VersionedValue) else versioned(value)


def unwrap_versioned_value(value: VersionedValue[T] | T) -> T:
    """`value` with every `versioned(...)` wrapper inside it removed (dataclasses and dicts are
    copied, lists and tuples rebuilt). Raises ValueError on step references, whose values are
    only known when the step runs."""

    def unwrap(obj: Any) -> Any:
        if isinstance(obj, VersionedValue):
            return unwrap(obj.value)
        if isinstance(obj, (InputName, OutputName, ExecutorStep)):
            raise ValueError(f"cannot unwrap a {type(obj).__name__}: its path is only known when the step runs")
        if is_dataclass_instance(obj) or isinstance(obj, dict):
            return copy_with(obj, unwrap)
        if isinstance(obj, (list, tuple)) and not hasattr(obj, "_fields"):
            return type(obj)(unwrap(v) for v in obj)
        return obj

    return unwrap(value)


def _placeholder_inside(value: Any, at: str) -> tuple[str, Any] | None:
    """(location, placeholder) of the first placeholder inside a value meant to be plain."""
    if isinstance(value, _PLACEHOLDERS):
        return at, value
    if is_dataclass_instance(value):
        items = ((f.name, getattr(value, f.name)) for f in dataclasses.fields(value))
    elif isinstance(value, dict):
        items = ((str(k), v) for k, v in value.items())
    elif isinstance(value, (list, tuple)):
        items = ((f"[{i}]", v) for i, v in enumerate(value))
    else:
        return None
    for key, item in items:
        found = _placeholder_inside(item, f"{at}.{key}" if at and not key.startswith("[") else f"{at}{key}")
        if found is not None:
            return found
    return None


def copy_with(obj: Any, convert: Callable[[Any], Any]) -> Any:
    """A shallow copy of a dataclass instance or dict with each field or value replaced by
    `convert(it)`.

    Copied, not rebuilt: `dataclasses.replace` re-runs `__init__` and `__post_init__` (so an
    InitVar falls back to its default and a derived field is derived again from its own
    result) and `type(d)(pairs)` fails for a defaultdict. Frozen dataclasses are set through
    `object.__setattr__`; a dict subclass keeps its type and state (a defaultdict its factory).
    """
    new = copy.copy(obj)
    if isinstance(obj, dict):
        for key, value in obj.items():
            new[key] = convert(value)
    else:
        for field in dataclasses.fields(obj):
            object.__setattr__(new, field.name, convert(getattr(obj, field.name)))
    return new


def join_path(base: str | None, name: str | None) -> str | None:
    """`base/name` with one slash between them; either alone when the other is empty."""
    if not name:
        return base
    if not base:
        return name
    return base.rstrip("/") + "/" + name.lstrip("/")


def is_dataclass_instance(obj: Any) -> bool:
    """True for dataclass instances (not classes)."""
    return dataclasses.is_dataclass(obj) and not isinstance(obj, type)
