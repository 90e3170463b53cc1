"""Planning-time checks of a stage's functions: on Ray every one must pickle.

A stage's program is pickled once to check it. On Ray (`requires_pickling`) a failure is a
`PlanError` naming the op and the function, before anything runs. The in-process backends run
such a pipeline as given and only warn, once per function and process, that it could not run
on Ray; they pickle a stage only until it pickled once in this process (by its fingerprint),
so a big capture is not pickled on every run.
"""

from __future__ import annotations

import dataclasses
import warnings
import weakref
from typing import Any

import cloudpickle

from zephyr.errors import PlanError
from zephyr.execution.provenance import writer_codes
from zephyr.naming import callable_name
from zephyr.tasks import StageProgram

__all__ = ["NotPicklableWarning", "stage_program"]

_pickled_in_process: set[str] = set()  # fingerprints of stages an in-process run found picklable
_warned: weakref.WeakSet = weakref.WeakSet()  # functions warned about in this process
_warned_names: set[str] = set()  # culprits without a function object to hold on to


class NotPicklableWarning(UserWarning):
    """A pipeline function cannot be pickled: fine in-process, refused by the Ray backend."""


def stage_program(stage, requires_pickling: bool) -> StageProgram:
    """What every task of `stage` runs, checked to pickle (see the module docstring)."""
    program = StageProgram(stage.index, stage.ops, reader=stage.input if not isinstance(stage.input, tuple) else None,
                           sink=stage.sink, codes=writer_codes(stage))
    if not requires_pickling and stage.fingerprint in _pickled_in_process:
        return program  # in-process the check only feeds a warning: pickle a big capture once
    try:
        cloudpickle.dumps(program)
    except Exception as e:
        culprit, fn = _first_unpicklable(stage)
        if not requires_pickling:  # nothing leaves this process: run it as given
            _warn_not_picklable(culprit, fn, e)
            return program
        raise PlanError(
            f"stage {stage.index}: {culprit} cannot be pickled, so it cannot be sent to workers: "
            f"{type(e).__name__}: {e}. Define it at module level or avoid capturing locks, open files or clients "
            "(share large objects with backend.put(name, obj) and zephyr.get_shared(name))."
        ) from e
    if not requires_pickling and stage.fingerprint:
        _pickled_in_process.add(stage.fingerprint)
    return program


def _warn_not_picklable(culprit: str, fn: Any, error: Exception) -> None:
    """Once per function and process: the pipeline runs here, but could not run on Ray."""
    try:
        if fn in _warned:
            return
        _warned.add(fn)
    except TypeError:  # not weak-referenceable (or None): remember the description instead
        if culprit in _warned_names:
            return
        _warned_names.add(culprit)
    warnings.warn(
        f"{culprit} cannot be pickled ({type(error).__name__}: {error}); it runs on this in-process "
        "backend, but this pipeline will not run on the ray backend",
        NotPicklableWarning,
        stacklevel=2,
    )


def _first_unpicklable(stage) -> tuple[str, Any]:
    """The op (and function) that cannot be pickled, described, and the function (or None):
    ops first, then the shuffle's key, sort_by, combiner (the sink) and reducer (the reader)."""
    parts = list(stage.ops) + [p for p in (stage.sink, None if isinstance(stage.input, tuple) else stage.input) if p is not None]
    for part in parts:
        try:
            cloudpickle.dumps(part)
        except Exception:
            fn = _first_unpicklable_callable(part)
            return f"{part.describe()}" + (f" (function {callable_name(fn)})" if fn is not None else ""), fn
    return "the stage's input or sink", None


def _first_unpicklable_callable(obj: Any, depth: int = 0) -> Any:
    if depth > 3 or not dataclasses.is_dataclass(obj):
        return None
    for field in dataclasses.fields(obj):
        value = getattr(obj, field.name)
        try:
            cloudpickle.dumps(value)
        except Exception:
            if callable(value) and not dataclasses.is_dataclass(value):
                return value
            return _first_unpicklable_callable(value, depth + 1) or (value if callable(value) else None)
    return None
