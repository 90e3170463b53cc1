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

JAX is imported only when the training adapter is used (install ``marin[tpu]``).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

from marin.tpu.data import DataPosition, MixturePosition, TokenBatches, resolve_shards
from marin.tpu.lockfile import remove_tpu_lockfile, remove_tpu_lockfile_on_exit
from marin.tpu.runner import PREEMPTION_ERRORS, TpuPreemptedError, TpuSetupError, is_preemption, run_on_tpu
from marin.tpu.slices import (
    GENERATIONS,
    TpuGeneration,
    TpuSlice,
    host_resources,
    parse_tpu_type,
    simulated_host,
    tpu_resources,
    valid_tpu_types,
)
from marin.tpu.preemption import PREEMPTED_EXIT_CODE, TrainingPreempted
from marin.tpu.token_cache import CacheBatches, MixtureBatches, TokenCache
from marin.tpu.train import TrainResult, train_loop, train_on_tpu

if TYPE_CHECKING:
    from marin.tpu.checkpoint import Checkpoint, Checkpointer, latest_step, load_checkpoint, save_checkpoint
    from marin.tpu.mesh import fsdp_sharding, make_mesh

# Names whose modules import JAX: loaded on first use, so `import marin.tpu` stays light
# (the driver that only schedules slices needs no JAX).
_LAZY = {
    "Checkpoint": "marin.tpu.checkpoint",
    "Checkpointer": "marin.tpu.checkpoint",
    "latest_step": "marin.tpu.checkpoint",
    "load_checkpoint": "marin.tpu.checkpoint",
    "save_checkpoint": "marin.tpu.checkpoint",
    "fsdp_sharding": "marin.tpu.mesh",
    "make_mesh": "marin.tpu.mesh",
}


def __getattr__(name: str):
    if name in _LAZY:
        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'marin.tpu' has no attribute {name!r}")

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
    "tpu_resources",
    "train_loop",
    "train_on_tpu",
    "valid_tpu_types",
]
