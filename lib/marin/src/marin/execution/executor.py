"""The executor's public API, where Marin experiments import it from.

    from marin.execution.executor import ExecutorStep, executor_main, output_path_of, this_output_path

Every name an experiment uses lives here (`marin.execution` re-exports them): steps and the
placeholders of their configs (`steps`), `executor_main` and its options (`main`), and the
`Executor` that runs a plan of steps (`runner`).
"""

from marin.execution.main import ExecutorMainConfig, executor_main
from marin.execution.runner import SKIPPED, Executor, ExecutorError, ExecutorInterrupted, StepFailedError
from marin.execution.status import StepStatus, read_status, read_step_record
from marin.execution.steps import (
    THIS_OUTPUT_PATH,
    ExecutorStep,
    InputName,
    OutputName,
    VersionedValue,
    ensure_versioned,
    get_executor_step,
    output_path_of,
    this_output_path,
    unwrap_versioned_value,
    versioned,
)

__all__ = [
    "SKIPPED",
    "THIS_OUTPUT_PATH",
    "Executor",
    "ExecutorError",
    "ExecutorInterrupted",
    "ExecutorMainConfig",
    "ExecutorStep",
    "InputName",
    "OutputName",
    "StepFailedError",
    "StepStatus",
    "VersionedValue",
    "ensure_versioned",
    "executor_main",
    "get_executor_step",
    "output_path_of",
    "read_status",
    "read_step_record",
    "this_output_path",
    "unwrap_versioned_value",
    "versioned",
]
