"""Run JAX work on TPU slices of a Ray cluster: slice types, head resources, lockfile
hygiene, a preemption-tolerant runner and a resumable training loop.

    from marin.tpu import run_on_tpu, tpu_resources, train_on_tpu

- :mod:`marin.tpu.slices`: the table of v4/v5e/v5p/v6e slice types and their Ray resources.
- :mod:`marin.tpu.lockfile`: ``remove_tpu_lockfile_on_exit``.
- :mod:`marin.tpu.runner`: ``run_on_tpu`` (reserve a slice, run on every host, retry).
- :mod:`marin.tpu.data`, :mod:`marin.tpu.checkpoint`, :mod:`marin.tpu.train`: the training
  adapter (packed token batches from Zephyr shards, atomic checkpoints, the loop).
- :mod:`marin.tpu.tiny_lm`: a tiny byte-level model (imports JAX; not imported here).

JAX is imported only inside the functions that need it (install ``marin[tpu]``).
"""

from marin.tpu.checkpoint import Checkpoint, latest_step, load_checkpoint, save_checkpoint
from marin.tpu.data import DataPosition, TokenBatches, resolve_shards
from marin.tpu.lockfile import remove_tpu_lockfile, remove_tpu_lockfile_on_exit
from marin.tpu.runner import PREEMPTION_ERRORS, TpuPreemptedError, TpuSetupError, is_preemption, run_on_tpu
from marin.tpu.slices import (
    GENERATIONS,
    TpuGeneration,
    TpuSlice,
    host_resources,
    parse_tpu_type,
    tpu_resources,
    valid_tpu_types,
)
from marin.tpu.train import TrainResult, train_loop, train_on_tpu

__all__ = [
    "GENERATIONS",
    "PREEMPTION_ERRORS",
    "Checkpoint",
    "DataPosition",
    "TokenBatches",
    "TpuGeneration",
    "TpuPreemptedError",
    "TpuSetupError",
    "TpuSlice",
    "TrainResult",
    "host_resources",
    "is_preemption",
    "latest_step",
    "load_checkpoint",
    "parse_tpu_type",
    "remove_tpu_lockfile",
    "remove_tpu_lockfile_on_exit",
    "resolve_shards",
    "run_on_tpu",
    "save_checkpoint",
    "tpu_resources",
    "train_loop",
    "train_on_tpu",
    "valid_tpu_types",
]
