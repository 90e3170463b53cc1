"""What a running task sees of its pipeline, at the module path the reference project uses:
`zephyr_worker_ctx().get_shared(name)`, `.task_memory_bytes`; and the counter aggregations."""

from zephyr.context import WorkerContext, zephyr_worker_ctx
from zephyr.counters import Aggregation

__all__ = ["Aggregation", "WorkerContext", "zephyr_worker_ctx"]
