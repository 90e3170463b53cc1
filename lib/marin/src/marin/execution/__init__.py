"""Marin's executor: experiments as DAGs of versioned, resumable steps.

Define `ExecutorStep`s whose configs refer to each other with `output_path_of`, mark the
fields that matter with `versioned`, and call `executor_main(steps)`. Each step writes under
`<prefix>/<name>-<hash>`; see `marin.execution.hashing` for exactly what the hash covers
and docs/executor.md for a tour. `marin.execution.executor` is the canonical module of the
experiment-facing names (as in Marin); they are re-exported here.
"""

from marin.execution.executor import (
    SKIPPED,
    THIS_OUTPUT_PATH,
    Executor,
    ExecutorError,
    ExecutorInterrupted,
    ExecutorMainConfig,
    ExecutorStep,
    InputName,
    OutputName,
    StepFailedError,
    StepStatus,
    VersionedValue,
    ensure_versioned,
    executor_main,
    get_executor_step,
    output_path_of,
    read_status,
    read_step_record,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)
from marin.execution.hashing import hash_version, version_of
from marin.execution.lease import Lease
from marin.execution.planning import Plan, PlannedStep
from marin.execution.ray_env import optional_dependency_groups, pip_runtime_env
from marin.execution.status import read_info

__all__ = [
    "SKIPPED",
    "THIS_OUTPUT_PATH",
    "Executor",
    "ExecutorError",
    "ExecutorInterrupted",
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
    "ensure_versioned",
    "executor_main",
    "get_executor_step",
    "hash_version",
    "optional_dependency_groups",
    "output_path_of",
    "pip_runtime_env",
    "read_info",
    "read_status",
    "read_step_record",
    "this_output_path",
    "unwrap_versioned_value",
    "version_of",
    "versioned",
]
