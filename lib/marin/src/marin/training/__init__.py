"""Train a JAX model on a TPU slice, resumably: the training-step adapter over :mod:`marin.tpu`.

    from marin.training import train_on_tpu, train_loop, TokenBatches, fsdp_sharding

- :mod:`marin.training.data`: packed token batches from Zephyr's JSON/Parquet shards, each host
  reading its rows; the data position saved with a checkpoint.
- :mod:`marin.training.token_cache`: random access to a tokenized cache and weighted mixtures.
- :mod:`marin.training.mesh`: the device mesh, batch and state shardings (``fsdp_sharding``).
- :mod:`marin.training.checkpoint`: sharded, asynchronous orbax checkpoints.
- :mod:`marin.training.preemption`: save at the next step on the preemption notice, exit 143.
- :mod:`marin.training.train`: ``train_loop`` (every host) and ``train_on_tpu`` (through
  :func:`marin.tpu.run_on_tpu`).
- :mod:`marin.training.tiny_lm`: a tiny byte-level model for examples and tests.

Names load on first use: JAX only with the mesh, checkpoint and tiny_lm modules (install
``marin[tpu]``). Every name is also importable from :mod:`marin.tpu`, its earlier home.
"""

from __future__ import annotations

from marin._lazy import lazy_names

__getattr__, __dir__, __all__ = lazy_names(__name__, {
    "marin.training.data": ("DataPosition", "MixturePosition", "TokenBatches", "resolve_shards"),
    "marin.training.token_cache": ("CacheBatches", "MixtureBatches", "TokenCache"),
    "marin.training.preemption": ("PREEMPTED_EXIT_CODE", "TrainingPreempted"),
    "marin.training.train": ("TrainResult", "train_loop", "train_on_tpu"),
    "marin.training.checkpoint": ("Checkpoint", "Checkpointer", "latest_step", "load_checkpoint", "save_checkpoint"),
    "marin.training.mesh": ("fsdp_sharding", "make_mesh"),
})
