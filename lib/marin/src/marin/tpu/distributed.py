"""Multi-host JAX: join every host of a slice into one JAX program.

On a slice of H hosts each host runs one process; ``jax.distributed.initialize`` connects
them through a coordinator (process 0) so that ``jax.devices()`` lists all H hosts' devices
and collectives span the slice. It must run before anything touches a JAX backend.

:func:`~marin.tpu.runner.run_on_tpu` calls :func:`initialize` on every host of a
multi-host run (the coordinator's address travels through Ray) and :func:`shutdown` when
the host's function returns. On the CPU (tests, simulated hosts) cross-process collectives
go through gloo.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from zephyr.backends import ray_local

__all__ = ["DistributedConfig", "free_port", "initialize", "shutdown"]

logger = logging.getLogger(__name__)

# How long a host waits for the others to reach the coordinator (slices start unevenly).
INIT_TIMEOUT_S = int(os.environ.get("MARIN_JAX_INIT_TIMEOUT_S", "300"))


@dataclass(frozen=True)
class DistributedConfig:
    """Where this host's process sits in the multi-host JAX program."""

    coordinator_address: str  # "ip:port" of process 0's coordinator service
    num_processes: int
    process_id: int


def free_port() -> int:
    """A TCP port nothing listens on right now on any address (for the coordinator, on process
    0's host, which the other hosts reach by its IP)."""
    return ray_local.free_port(host="")


def initialize(config: DistributedConfig) -> None:
    """``jax.distributed.initialize`` for this host, before JAX is used in this process.

    Raises:
        RuntimeError: JAX already initialised a backend in this process (multi-host JAX needs
            a fresh process: keep ``run_on_tpu(fresh_process=True)``).
    """
    import jax

    # Cross-process collectives on the CPU backend (a no-op for TPU/GPU computations).
    jax.config.update("jax_cpu_collectives_implementation", "gloo")
    logger.info("joining multi-host JAX as process %d/%d (coordinator %s)",
                config.process_id, config.num_processes, config.coordinator_address)
    try:
        jax.distributed.initialize(
            coordinator_address=config.coordinator_address,
            num_processes=config.num_processes,
            process_id=config.process_id,
            initialization_timeout=INIT_TIMEOUT_S,
        )
    except RuntimeError as e:
        if any(text in str(e) for text in ("before any JAX", "only be called once", "already")):
            raise RuntimeError(
                f"cannot join multi-host JAX as process {config.process_id}: this worker process already "
                f"used JAX ({e}); run multi-host work in fresh processes (run_on_tpu(fresh_process=True))"
            ) from e
        raise


def shutdown() -> None:
    """Leave the multi-host program (best effort: the process may be about to exit anyway)."""
    import jax

    try:
        jax.distributed.shutdown()
    except Exception as e:  # noqa: BLE001 - a peer already gone must not mask fn's result
        logger.warning("jax.distributed.shutdown failed: %s", e)
