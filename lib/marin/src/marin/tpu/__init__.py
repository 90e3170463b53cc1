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

from marin import training as _training
from marin._lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "marin.tpu.slices": ("GENERATIONS", "TpuGeneration", "TpuSlice", "host_resources", "parse_tpu_type",
                         "simulated_host", "tpu_head_resource", "tpu_resources", "valid_tpu_types"),
    "marin.tpu.lockfile": ("remove_tpu_lockfile", "remove_tpu_lockfile_on_exit"),
    "marin.tpu.errors": ("TpuPreemptedError", "TpuSetupError", "is_preemption"),
    "marin.tpu.runner": ("PREEMPTION_ERRORS", "run_on_tpu"),
    "marin.training": _training.__all__,  # its earlier home
})
