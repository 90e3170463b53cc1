"""Versions and output paths of steps, and resolving a config's placeholders.

A step's output path is `<prefix>/<name>-<hash>`, where `<hash>` is the first 8 hex digits
of the MD5 of a JSON *version record*. Exactly these things count in the record:

1. the step's `name`;
2. every `versioned(value)` in the config, keyed by its field path (e.g. `"sampling.seed"`;
   a dict key containing `.`, `[`, `]`, `"` or `\\` is written as `["json string"]`, so
   `{"a.b": v}` and `{"a": {"b": v}}` differ). Tuples inside a versioned value are recorded
   as `{"__tuple__": [...]}`, so `versioned((1, 2))` and `versioned([1, 2])` differ, and a
   dict key inside one that is an int, float, bool or None as `"<type:repr>"` (as in field
   paths), so `versioned({0: v})` and `versioned({"0": v})` differ;
3. every input reference in the config, keyed by its field path:
   - `output_path_of(step, subpath)` records the dependency's version id (`<name>-<hash>`)
     and the subpath;
   - `InputName.hardcoded(path)` records the path as written (different input data,
     different output), with any subpath joined on;
4. the version ids of all dependencies, sorted (each once, so two identical dependency steps
   count like one; sorted, so the order of a config dict's keys, e.g. built from a set, does
   not move the path); the version ids of non-blocking references (`.nonblocking()`) are
   listed apart, sorted, under `pseudo_dependencies`, and only when there are some (so
   adding none changes no hash).

A dependency with `override_output_path` has the version id `<name>-<hash>@<override>`, so
moving a dependency's override changes the version (and path) of everything downstream.

Nothing else counts: not the function (renaming or editing `fn` keeps the path), not plain
unversioned config fields, not `this_output_path()`, `description`, `resources`,
`pip_dependency_groups`, a step's own `override_output_path` (it replaces that step's path
outright), and not the prefix. Because a dependency counts through its own version id,
changing a versioned field of a step changes the path of that step and of everything
downstream of it, and of nothing else.

The version record is written to each step's info file so a path can be explained later.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
from typing import Any, Callable, Iterator

from marin.execution.steps import (
    ExecutorStep,
    InputName,
    OutputName,
    VersionedValue,
    copy_with,
    is_dataclass_instance,
    join_path,
)

__all__ = ["HASH_LENGTH", "dependencies_of", "pseudo_dependencies_of", "version_of", "hash_version", "resolve_config"]

HASH_LENGTH = 8


def _walk(obj: Any, path: str) -> Iterator[tuple[str, Any]]:
    """Yield (field path, placeholder) for every placeholder inside `obj`, depth first."""
    if isinstance(obj, (InputName, OutputName, VersionedValue, ExecutorStep)):
        yield path, obj
    elif is_dataclass_instance(obj):
        for field in dataclasses.fields(obj):
            yield from _walk(getattr(obj, field.name), _dotted(path, field.name))
    elif isinstance(obj, dict):
        for key, value in obj.items():
            # a key that is not a str by its type and repr: {1: v} and {"1": w} are two fields
            yield from _walk(value, _dotted(path, key if isinstance(key, str) else f"<{type(key).__name__}:{key!r}>"))
    elif isinstance(obj, (list, tuple)):
        for index, value in enumerate(obj):
            yield from _walk(value, _dotted(path, str(index)))
    elif isinstance(obj, (set, frozenset)):
        # a set has no field paths and is not rebuilt when the config is resolved: a placeholder
        # in it would reach the step's function as itself (a dependency never waited for)
        for value in obj:
            for inner, _ in _walk(value, path):
                raise ValueError(
                    f"config field {inner or '(the config)'}: a {type(obj).__name__} holds an input, output or versioned "
                    "placeholder, which would not be resolved; use a list or a tuple"
                )


_SPECIAL = frozenset('.[]"\\')


def _dotted(prefix: str, key: str) -> str:
    if _SPECIAL.intersection(key):  # keep "a.b" (one key) apart from "a" -> "b" (two levels)
        key = f"[{json.dumps(key)}]"
    return f"{prefix}.{key}" if prefix else key


def _tagged(value: Any) -> Any:
    """A versioned value with tuples and non-str dict keys tagged, so JSON keeps them apart
    from lists and from str keys (json.dumps writes 0, True, None as "0", "true", "null")."""
    if isinstance(value, tuple):
        return {"__tuple__": [_tagged(v) for v in value]}
    if isinstance(value, list):
        return [_tagged(v) for v in value]
    if isinstance(value, dict):
        return {_tagged_key(k): _tagged(v) for k, v in value.items()}
    return value


def _tagged_key(key: Any) -> Any:
    """`key` itself when a str, `"<type:repr>"` (as in field paths) when another JSON key type.

    Other keys are left for json.dumps to refuse: their repr may hold a memory address.
    """
    if isinstance(key, str) or not isinstance(key, (int, float, bool, type(None))):
        return key
    return f"<{type(key).__name__}:{key!r}>"


def _as_input(obj: Any) -> InputName | None:
    if isinstance(obj, ExecutorStep):
        return InputName(obj)
    return obj if isinstance(obj, InputName) else None


def _referenced_steps(step: ExecutorStep, blocking: bool) -> dict[int, ExecutorStep]:
    found: dict[int, ExecutorStep] = {}
    for _, obj in _walk(step.config, ""):
        ref = _as_input(obj)
        if ref is not None and ref.step is not None and ref.block_on_step == blocking:
            found.setdefault(id(ref.step), ref.step)
    return found


def dependencies_of(step: ExecutorStep) -> list[ExecutorStep]:
    """The steps `step` waits for: those its config refers to (blocking), in order of first appearance."""
    return list(_referenced_steps(step, blocking=True).values())


def pseudo_dependencies_of(step: ExecutorStep) -> list[ExecutorStep]:
    """The steps referred to only through `.nonblocking()`: versioned, never waited for."""
    blocking = _referenced_steps(step, blocking=True)
    return [dep for key, dep in _referenced_steps(step, blocking=False).items() if key not in blocking]


def version_of(step: ExecutorStep, version_id: Callable[[ExecutorStep], str]) -> dict[str, Any]:
    """The JSON version record of `step` (see the module docstring for what counts).

    `version_id(dep)` returns a dependency's version id (`<name>-<hash>`, plus `@<override>`
    when it has an `override_output_path`); dependencies are versioned first.
    """
    config: dict[str, Any] = {}
    for path, obj in _walk(step.config, ""):
        ref = _as_input(obj)
        if ref is not None:
            if ref.step is not None:
                config[path] = {"dependency": version_id(ref.step), "subpath": ref.subpath}
            else:
                config[path] = {"hardcoded": ref.path}
        elif isinstance(obj, VersionedValue):
            config[path] = _tagged(obj.value)
    # sorted: the order of first appearance follows a dict's insertion order, which may differ
    # between processes (a dict built from a set) though the config is the same
    version: dict[str, Any] = {
        "name": step.name,
        "config": config,
        "dependencies": sorted({version_id(dep) for dep in dependencies_of(step)}),
    }
    # by version id: an identical copy of a blocking dependency is that dependency (the planner
    # folds identical steps), not a step referred to only through `.nonblocking()`
    blocking = set(version["dependencies"])
    pseudo = sorted({version_id(dep) for dep in pseudo_dependencies_of(step)} - blocking)
    if pseudo:  # absent otherwise, so that steps without any keep their hashes
        version["pseudo_dependencies"] = pseudo
    return version


def hash_version(version: dict[str, Any]) -> str:
    """The short hash of a version record; raises TypeError for non-JSON versioned values."""
    try:
        text = json.dumps(version, sort_keys=True, separators=(",", ":"))
    except TypeError as e:
        raise TypeError(f"step {version.get('name')!r}: versioned values must be JSON-serialisable ({e})") from e
    return hashlib.md5(text.encode("utf-8")).hexdigest()[:HASH_LENGTH]


def resolve_config(
    config: Any, output_path: Callable[[ExecutorStep], str], own_output_path: str, prefix: str | None = None
) -> Any:
    """A copy of `config` with every placeholder replaced by its concrete value.

    Input references become path strings (a relative hardcoded path is taken under `prefix`),
    `this_output_path()` the step's own output path, `versioned(v)` becomes `v`. The
    original config is not modified.
    """

    def resolve(obj: Any) -> Any:
        ref = _as_input(obj)
        if ref is not None:
            if ref.step is not None:
                return join_path(output_path(ref.step), ref.subpath)
            return under_prefix(prefix, ref.path)
        if isinstance(obj, OutputName):
            return join_path(own_output_path, obj.name)
        if isinstance(obj, VersionedValue):
            return obj.value
        if is_dataclass_instance(obj) or isinstance(obj, dict):
            return copy_with(obj, resolve)  # without re-running __init__: the config as written
        if isinstance(obj, tuple) and hasattr(obj, "_fields"):
            return type(obj)(*(resolve(value) for value in obj))
        if isinstance(obj, (list, tuple)):
            return type(obj)(resolve(value) for value in obj)
        return obj

    return resolve(config)


def under_prefix(prefix: str | None, path: str) -> str:
    """`path` itself when absolute (`/x`, `gs://b/x`), else `<prefix>/<path>`."""
    if prefix is None or "://" in path or path.startswith("/"):
        return path
    return join_path(prefix.rstrip("/"), path)
