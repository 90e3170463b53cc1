"""Workers started ahead for the next run on zephyr's reused local Ray.

Ray starts a job's worker processes when its first tasks arrive and ends them with the job, so a
run on a reused Ray still waits for its workers (a Python process, `import ray`, registering, then
zephyr's import on the first task). When a run on zephyr's head ends, `warm_next_run` asks the
raylet to start as many workers as the run kept busy for the next job with the same runtime
environment (`PrestartWorkers`, the raylet's own request for this; no job yet). Each imports
zephyr at start (the setup hook, `zephyr.backends.ray_reuse.enter_driver_cwd`). The next run from
the same shell (same environment and directory, so the same `runtime_env` and hash) gets them at
once; any other run starts its own, as before. Ray keeps idle workers up to the node's CPU count
and ends the oldest beyond it, so the warm ones never hold more than a run's workers did, and they
end with the head.

The job's `runtime_env` carries `code_stamp()`: the modification times of zephyr's source and of
the environment's `site-packages`, so a warm worker never runs code older than its run's (an
edited zephyr, a package installed since). `ZEPHYR_RAY_WARM_WORKERS=0` turns this off. A raylet
that refuses is said at INFO, and the next run starts its workers itself.
"""

from __future__ import annotations

import logging
import os
import sys
from pathlib import Path

from zephyr.backends.ray_head import HeadState
from zephyr.switches import switched_on

__all__ = ["STAMP_VARIABLE", "WARM_SWITCH", "code_stamp", "warm_next_run"]

logger = logging.getLogger("zephyr")

STAMP_VARIABLE = "ZEPHYR_CODE_STAMP"
WARM_SWITCH = "ZEPHYR_RAY_WARM_WORKERS"
TIMEOUT_S = 10.0


def code_stamp() -> str:
    """The newest modification time (ns) among zephyr's source files and the `site-packages`
    folders on sys.path (a package installed or removed changes its folder's)."""
    newest = 0
    for root, _, files in os.walk(Path(__file__).resolve().parents[1]):  # the zephyr package
        for name in files:
            if name.endswith(".py"):
                newest = max(newest, os.stat(os.path.join(root, name)).st_mtime_ns)
    for entry in sys.path:
        if entry.endswith("site-packages") and os.path.isdir(entry):
            newest = max(newest, os.stat(entry).st_mtime_ns)
    return str(newest)


def warm_next_run(head: HeadState, busy: int, num_cpus: float) -> int:
    """Ask this node's raylet to start workers for the next run like this one: `busy` (the most
    tasks this run had in flight) at most, and no more than the node's CPUs hold tasks of
    `num_cpus`. Returns how many were asked for (0: none, or the raylet refused)."""
    if busy <= 0 or not switched_on(WARM_SWITCH):
        return 0
    try:
        return _prestart(head, busy, num_cpus)
    except Exception as e:  # noqa: BLE001 - an optimisation: the next run starts its own workers
        logger.info("zephyr: could not start workers ahead for the next run (%s: %s); it starts its own", type(e).__name__, e)
        return 0


def _prestart(head: HeadState, busy: int, num_cpus: float) -> int:
    import grpc
    import ray
    from ray.core.generated import common_pb2, node_manager_pb2, node_manager_pb2_grpc, runtime_environment_pb2

    context = ray.get_runtime_context()
    node = next(n for n in ray.nodes() if n["NodeID"] == context.get_node_id())
    fits = int((node.get("Resources") or {}).get("CPU", 0) // num_cpus) if num_cpus > 0 else busy
    workers = min(busy, fits)
    if workers <= 0:
        return 0
    request = node_manager_pb2.PrestartWorkersRequest(
        language=common_pb2.Language.PYTHON, num_workers=workers, keep_alive_duration_secs=0,
        runtime_env_info=runtime_environment_pb2.RuntimeEnvInfo(serialized_runtime_env=context.get_runtime_env_string()))
    token = Path(head.token_path).read_text().strip()
    with grpc.insecure_channel(f"{node['NodeManagerAddress']}:{node['NodeManagerPort']}") as channel:
        node_manager_pb2_grpc.NodeManagerServiceStub(channel).PrestartWorkers(
            request, metadata=[("authorization", f"Bearer {token}")], timeout=TIMEOUT_S)
    return workers
