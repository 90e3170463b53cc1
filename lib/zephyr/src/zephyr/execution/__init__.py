"""Execution: running a plan's stages as tasks, and the promises kept while doing so.

- `runner`: `Execution`, the run as a whole (stage after stage, skip what is done, finish).
- `stage_loop`: one stage on a task pool: bounded window, retries by cause, shard order.
- `speculation`: when a straggling shard gets a second attempt (the first to finish wins).
- `pool`: what the runner needs of a backend (`TaskPool`), and an inline pool.
- `shard`: the function every task runs: the fused op chain over one shard, writers.
- `loaders`: a shard's reading of a load op (pushdown applied).
- `checks`: planning-time picklability checks.
- `scratch`: where shuffles spill, what a rerun resumes, when scratch goes.
- `provenance`: what each skip_existing output was made from; stale outputs refused.
- `run_lock`: leases on outputs and scratch, so two runs never write one output.
- `retry`, `interrupts`, `failed_record`: backoff, Ctrl-C/SIGTERM, the record a shard died on.
- `observe`, `report`, `progress`, `summary`: what the run tells the status page, the run
  record, the terminal.

Sits above `plan`, `shuffle` and `status`, below `backends` (a backend is a task pool plus
`execute`, which builds an `Execution`).
"""

# The reference project's `zephyr.execution` holds its context API; here that lives a layer
# up, in `zephyr.context`. Its names resolve on first use (PEP 562), so importing the runner's
# modules never imports the backends.
_CONTEXT_NAMES = ("MAX_SHARD_FAILURES", "MAX_SHARD_INFRA_FAILURES", "WorkerContext", "ZephyrContext", "ZephyrExecutionResult",
                  "ZephyrWorkerError", "zephyr_worker_ctx")


def __getattr__(name: str):
    if name in _CONTEXT_NAMES:
        from zephyr import context  # the one upward reference: a compatibility path, resolved lazily

        return getattr(context, name)
    raise AttributeError(f"module 'zephyr.execution' has no attribute {name!r}")
