"""Run JAX work on the TPU slices of a Ray cluster: slice types, head resources, lockfile
hygiene and a preemption-tolerant runner (the slice adapter; the training loop on top of it
is :mod:`marin.training`, whose names this facade re-exports too).

    from marin.tpu import run_on_tpu, tpu_resources, train_on_tpu

- :mod:`marin.tpu.slices`: the table of v4/v5e/v5p/v6e slice types and their Ray resources.
- :mod:`marin.tpu.lockfile`: ``remove_tpu_lockfile_on_exit``.
- :mod:`marin.tpu.errors`: ``TpuPreemptedError``, ``TpuSetupError``, ``is_preemption`` (no Ray at import).
- :mod:`marin.tpu.runner`: ``run_on_tpu`` (reserve a slice, run on every host, retry).
- :mod:`marin.tpu.distributed`: joining the hosts of a slice into one multi-host JAX program.

Names load on first use (:mod:`marin._lazy`): ``import marin.tpu.slices`` needs neither Ray
nor JAX; Ray loads when a slice is run, JAX when the training adapter is used (install
``marin[tpu]``). ``marin.tpu.train``, ``.data``, ``.mesh``, ``.checkpoint``, ``.token_cache``,
``.tiny_lm`` and ``.preemption`` are the old paths of :mod:`marin.training`'s modules.
"""

from __future__ import annotations

from marin._lazy import lazy_names

__getattr__, __dir__ = lazy_names(__name__, {
    "marin.tpu.slices": ("GENERATIONS", "TpuGeneration", "TpuSlice", "host_resources", "parse_tpu_type",
                         "simulated_host", "tpu_head_resource", "tpu_resources", "valid_tpu_types"),
    "marin.tpu.lockfile": ("remove_tpu_lockfile", "remove_tpu_lockfile_on_exit"),
    "marin.tpu.errors": ("TpuPreemptedError", "TpuSetupError", "is_preemption"),
    "marin.tpu.runner": ("PREEMPTION_ERRORS", "run_on_tpu"),
    "marin.training": ("CacheBatches", "Checkpoint", "Checkpointer", "DataPosition", "MixtureBatches",
                       "MixturePosition", "PREEMPTED_EXIT_CODE", "TokenBatches", "TokenCache", "TrainResult",
                       "TrainingPreempted", "fsdp_sharding", "latest_step", "load_checkpoint", "make_mesh",
                       "resolve_shards", "save_checkpoint", "train_loop", "train_on_tpu"),
})

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
