"""What the executor writes about a run besides each step's status: the experiment record and
each step's info file.

The experiment record (`<prefix>/experiments/<script>-<hash>.json`) lists the steps, their
state, the git commit, the calling script and the date; `marin steps` reads it. A step's
info file (see `status.write_info`) holds its name, function, version, hash and resolved
config, as JSON (dataclasses are written as dicts with their type's name).
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import subprocess
from typing import Any

from marin.execution import storage
from marin.execution.planning import Plan, PlannedStep
from marin.execution.status import now_iso

__all__ = ["ExperimentRecord", "step_info"]


class ExperimentRecord:
    """The record of one run of `plan`, at a path named after the script and the steps."""

    def __init__(self, plan: Plan, *, caller: str, base_path: str, prefix: str, description: str | None):
        digest = hashlib.md5("\n".join(sorted(p.output_path for p in plan.steps)).encode()).hexdigest()[:8]
        stem = os.path.splitext(os.path.basename(caller))[0] or "experiment"
        self.path = f"{base_path}/{stem}-{digest}.json"
        self.plan, self.caller, self.prefix, self.description = plan, caller, prefix, description
        self._git_commit: str | None = None

    def write(self, states: dict[str, str], interrupted_by: str | None = None) -> None:
        """Write each step's state (`PENDING` for those without one); `interrupted_by` names the signal."""
        record = {
            "description": self.description,
            "caller": self.caller,
            "git_commit": self._commit(),
            "date": now_iso(),
            "prefix": self.prefix,
            "steps": [
                {
                    "name": p.name,
                    "output_path": p.output_path,
                    "hash": p.hash,
                    "dependencies": p.dependencies,
                    "state": states.get(p.output_path, "PENDING"),
                }
                for p in self.plan.steps
            ],
        }
        if interrupted_by is not None:  # steps still PENDING never started
            record["interrupted_by"] = interrupted_by
        storage.write_json(self.path, record)

    def _commit(self) -> str | None:
        if self._git_commit is None:
            self._git_commit = _git_commit(os.path.dirname(self.caller)) or ""
        return self._git_commit or None


def step_info(planned: PlannedStep, resolved_config: Any) -> dict[str, Any]:
    """The info file of a step about to run with `resolved_config`."""
    step = planned.step
    fn = getattr(step.fn, "_function", step.fn)  # a Ray RemoteFunction wraps the Python function
    return {
        "name": step.name,
        "description": step.description,
        "fn": f"{getattr(fn, '__module__', '?')}.{getattr(fn, '__qualname__', repr(fn))}",
        "version": planned.version,
        "hash": planned.hash,
        "output_path": planned.output_path,
        "config": _jsonable(resolved_config),
        "dependencies": planned.dependencies,
        "pip_dependency_groups": step.pip_dependency_groups,
        "resources": step.resources,
        "date": now_iso(),
    }


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {"__type__": type(obj).__qualname__, **{f.name: _jsonable(getattr(obj, f.name)) for f in dataclasses.fields(obj)}}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj if isinstance(obj, (str, int, float, bool, type(None))) else repr(obj)


def _git_commit(directory: str) -> str | None:
    try:
        result = subprocess.run(
            ["git", "-C", directory or ".", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5, check=False
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return result.stdout.strip() or None
