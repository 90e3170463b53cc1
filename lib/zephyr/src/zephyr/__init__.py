"""Zephyr: a lazy, sharded Dataset API for large-corpus processing on preemptible clusters.

    from zephyr import Dataset, flow_backend

    pipeline = Dataset.from_files("gs://bucket/raw/*.jsonl.zst").load_jsonl().filter(keep).map(clean)
    list(flow_backend().execute(pipeline.write_jsonl("gs://bucket/out/{shard:05d}.jsonl.zst", skip_existing=True)))
"""

from zephyr import aggregate as agg
from zephyr import counters
from zephyr.backends import Backend, backend_names, create_backend, flow_backend, set_flow_backend
from zephyr.backends.shared import get_shared
from zephyr.context import ZephyrContext
from zephyr.plan.dataset import Dataset, ShardInfo
from zephyr.errors import NotConvergedError
from zephyr.errors import MissingColumnError, PlanError, ShardError
from zephyr.expr import Expr, col, lit, when
from zephyr.io import BadRecordError, CorruptInputError, TruncatedInputError, UnwritableRecordError
from zephyr.execution.provenance import StaleOutputsError
from zephyr.execution.quarantine import QuarantineLimitError, QuarantinedShardsError
from zephyr.execution.run_lock import OutputBusyError
from zephyr.execution.checks import NotPicklableWarning
from zephyr.execution.memory import task_memory

__all__ = [
    "BadRecordError",
    "Backend",
    "CorruptInputError",
    "Dataset",
    "Expr",
    "MissingColumnError",
    "NotConvergedError",
    "NotPicklableWarning",
    "OutputBusyError",
    "PlanError",
    "QuarantineLimitError",
    "QuarantinedShardsError",
    "ShardError",
    "ShardInfo",
    "StaleOutputsError",
    "TruncatedInputError",
    "UnwritableRecordError",
    "ZephyrContext",
    "agg",
    "backend_names",
    "col",
    "counters",
    "create_backend",
    "flow_backend",
    "get_shared",
    "lit",
    "set_flow_backend",
    "task_memory",
    "when",
]
