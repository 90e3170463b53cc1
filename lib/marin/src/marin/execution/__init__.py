"""Marin's executor: experiments as DAGs of versioned, resumable steps.

Define `ExecutorStep`s whose configs refer to each other with `output_path_of`, mark the
fields that matter with `versioned`, and call `executor_main(steps)`. Each step writes under
`<prefix>/<name>-<hash>`; see `marin.execution.hashing` for exactly what the hash covers
and docs/executor.md for a tour.
"""

from marin.execution.executor import SKIPPED, Executor, ExecutorError, StepFailedError
from marin.execution.hashing import hash_version, version_of
from marin.execution.lease import Lease
from marin.execution.main import ExecutorMainConfig, executor_main
from marin.execution.planning import Plan, PlannedStep
from marin.execution.ray_env import optional_dependency_groups, pip_runtime_env
from marin.execution.status import StepStatus, read_info, read_status
from marin.execution.steps import (
    ExecutorStep,
    InputName,
    OutputName,
    VersionedValue,
    output_path_of,
    this_output_path,
    versioned,
)

__all__ = [
    "SKIPPED",
    "Executor",
    "ExecutorError",
    "ExecutorMainConfig",
    "ExecutorStep",
    "InputName",
    "Lease",
    "OutputName",
    "Plan",
    "PlannedStep",
    "StepFailedError",
    "StepStatus",
    "VersionedValue",
    "executor_main",
    "hash_version",
    "optional_dependency_groups",
    "output_path_of",
    "pip_runtime_env",
    "read_info",
    "read_status",
    "this_output_path",
    "version_of",
    "versioned",
]
