"""Run JAX work on TPU slices of a Ray cluster: slice types, head resources, lockfile
hygiene, a preemption-tolerant runner and a resumable training loop.

    from marin.tpu import run_on_tpu, tpu_resources, train_on_tpu

- :mod:`marin.tpu.slices`: the table of v4/v5e/v5p/v6e slice types and their Ray resources.
- :mod:`marin.tpu.lockfile`: ``remove_tpu_lockfile_on_exit``.
- :mod:`marin.tpu.runner`: ``run_on_tpu`` (reserve a slice, run on every host, retry).
- :mod:`marin.tpu.distributed`: joining the hosts of a slice into one multi-host JAX program.
- :mod:`marin.tpu.data`, :mod:`marin.tpu.mesh`, :mod:`marin.tpu.checkpoint`, :mod:`marin.tpu.train`:
  the training adapter (packed token batches from Zephyr shards, each host reading its rows;
  the device mesh and shardings; sharded asynchronous orbax checkpoints; the loop).
- :mod:`marin.tpu.tiny_lm`: a tiny byte-level model (imports JAX; not imported here).

Names load on first use: JAX only when the training adapter is used (install ``marin[tpu]``),
Ray only when a slice is run.
"""

from __future__ import annotations

import importlib

# Every name is loaded from its module on first use, so `import marin.tpu.slices` (the cluster
# tooling, the job launcher) imports neither Ray, numpy nor JAX, and no module of this package
# imports another through this facade.
_LAZY = {
    **dict.fromkeys(("GENERATIONS", "TpuGeneration", "TpuSlice", "host_resources", "parse_tpu_type",
                     "simulated_host", "tpu_head_resource", "tpu_resources", "valid_tpu_types"), "marin.tpu.slices"),
    **dict.fromkeys(("remove_tpu_lockfile", "remove_tpu_lockfile_on_exit"), "marin.tpu.lockfile"),
    **dict.fromkeys(("TpuPreemptedError", "TpuSetupError", "is_preemption"), "marin.tpu.errors"),
    **dict.fromkeys(("PREEMPTION_ERRORS", "run_on_tpu"), "marin.tpu.runner"),
    **dict.fromkeys(("DataPosition", "MixturePosition", "TokenBatches", "resolve_shards"), "marin.tpu.data"),
    **dict.fromkeys(("CacheBatches", "MixtureBatches", "TokenCache"), "marin.tpu.token_cache"),
    **dict.fromkeys(("PREEMPTED_EXIT_CODE", "TrainingPreempted"), "marin.tpu.preemption"),
    **dict.fromkeys(("TrainResult", "train_loop", "train_on_tpu"), "marin.tpu.train"),
    **dict.fromkeys(("Checkpoint", "Checkpointer", "latest_step", "load_checkpoint", "save_checkpoint"),
                    "marin.tpu.checkpoint"),
    **dict.fromkeys(("fsdp_sharding", "make_mesh"), "marin.tpu.mesh"),
}


def __getattr__(name: str):
    if name in _LAZY:
        value = getattr(importlib.import_module(_LAZY[name]), name)
        globals()[name] = value
        return value
    raise AttributeError(f"module 'marin.tpu' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY})


__all__ = [
    "GENERATIONS",
    "PREEMPTED_EXIT_CODE",
    "PREEMPTION_ERRORS",
    "CacheBatches",
    "Checkpoint",
    "Checkpointer",
    "DataPosition",
    "MixtureBatches",
    "MixturePosition",
    "TokenBatches",
    "TokenCache",
    "TpuGeneration",
    "TpuPreemptedError",
    "TpuSetupError",
    "TpuSlice",
    "TrainResult",
    "TrainingPreempted",
    "fsdp_sharding",
    "host_resources",
    "is_preemption",
    "latest_step",
    "load_checkpoint",
    "make_mesh",
    "parse_tpu_type",
    "remove_tpu_lockfile",
    "remove_tpu_lockfile_on_exit",
    "resolve_shards",
    "run_on_tpu",
    "save_checkpoint",
    "simulated_host",
    "tpu_head_resource",
    "tpu_resources",
    "train_loop",
    "train_on_tpu",
    "valid_tpu_types",
]
