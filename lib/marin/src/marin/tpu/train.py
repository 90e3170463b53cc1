"""The training-step adapter: a resumable JAX training loop, run on a TPU slice.

The user supplies the model as two functions:

- ``init_state(key) -> state``: builds the initial training state (params, optimizer state,
  anything else) from a PRNG key (``jax.random.key(seed)``). It must be deterministic and
  traceable by ``jax.eval_shape``, which is how a resumed run learns the state's structure
  without computing it.
- ``train_step(state, batch) -> (state, metrics)``: one optimisation step, usually
  ``jax.jit``-ed. ``batch`` is an int32 ``[batch_size, seq_len]`` array of token ids;
  ``metrics`` is a dict of scalars.

:func:`train_loop` runs them in the current process on whatever JAX backend is present
(TPU, GPU or CPU): it resumes from the latest committed checkpoint (state and data position)
or initialises, feeds :class:`~marin.tpu.data.TokenBatches`, logs metrics every
``log_every`` steps, and checkpoints every ``checkpoint_every`` steps and at the end.
:func:`train_on_tpu` runs the same loop on every host of a slice through
:func:`~marin.tpu.runner.run_on_tpu`, so a preempted run restarts on a fresh slice and
continues from its last checkpoint. With a deterministic ``train_step`` the result equals
an uninterrupted run's.
"""

from __future__ import annotations

import functools
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from marin.tpu.checkpoint import load_checkpoint, save_checkpoint
from marin.tpu.data import DataPosition, TokenBatches, resolve_shards
from marin.tpu.runner import HOST_ID_ENV, run_on_tpu

__all__ = ["TrainResult", "train_loop", "train_on_tpu"]

logger = logging.getLogger(__name__)

TrainStep = Callable[[Any, Any], tuple[Any, dict]]
InitState = Callable[[Any], Any]


@dataclass(frozen=True)
class TrainResult:
    """What a finished training run reports (from the checkpoint-writing host)."""

    step: int
    checkpoint_path: str
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: int | None = None
    history: list[dict] = field(default_factory=list)  # {"step": n, **metrics} every log_every steps


def train_loop(
    train_step: TrainStep,
    init_state: InitState,
    data: str | Sequence[str],
    *,
    batch_size: int,
    seq_len: int,
    num_steps: int,
    checkpoint_path: str,
    checkpoint_every: int = 100,
    seed: int = 0,
    field: str = "input_ids",
    log_every: int = 10,
    keep_checkpoints: int = 2,
) -> TrainResult:
    """Train for ``num_steps`` total steps in this process, resuming from ``checkpoint_path``.

    Args:
        train_step: ``(state, batch) -> (state, metrics)``.
        init_state: ``key -> state``, called with ``jax.random.key(seed)``.
        data: a glob or a list of paths/globs of tokenized JSONL or Parquet shards.
        batch_size, seq_len: the shape of each batch.
        num_steps: the total number of steps of the run (not of this attempt).
        checkpoint_path: a directory URL (local, ``gs://``, ...) for checkpoints.
        checkpoint_every: steps between checkpoints; one is also written at the end.
        seed: the PRNG seed for ``init_state``.
        field: the record field that holds the token ids.
        log_every: steps between metric log lines (``logging`` at INFO on ``marin.tpu.train``).
        keep_checkpoints: how many committed checkpoints to keep.

    Raises:
        ValueError: on bad counts, or a checkpoint that does not match the state.
        FileNotFoundError: if ``data`` matches no files.
    """
    import jax

    for name, value in (("batch_size", batch_size), ("seq_len", seq_len), ("checkpoint_every", checkpoint_every),
                        ("log_every", log_every), ("keep_checkpoints", keep_checkpoints)):
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")
    shards = resolve_shards(data)
    key = jax.random.key(seed)
    restored = load_checkpoint(checkpoint_path, jax.eval_shape(init_state, key))
    if restored is None:
        state, step, position, metrics, history = init_state(key), 0, DataPosition(), {}, []
        logger.info("starting at step 0 on %s (%d shards)", jax.default_backend(), len(shards))
    else:
        state, step, position, metrics = restored.state, restored.step, restored.data_position, restored.metrics
        history = list(restored.history)
        logger.info("resuming at step %d from %s (data at %s)", step, restored.path, position)
    batches = TokenBatches(shards, batch_size=batch_size, seq_len=seq_len, field=field, position=position)
    writer = _is_checkpoint_writer()
    checkpoint = functools.partial(save_checkpoint, checkpoint_path, keep=keep_checkpoints, write=writer, history=history)
    last_saved = step if restored is not None else None
    window_start, window_step = time.monotonic(), step
    while step < num_steps:
        state, step_metrics = train_step(state, next(batches))
        step += 1
        if step % log_every == 0 or step == num_steps:
            metrics = {k: float(v) for k, v in jax.device_get(step_metrics).items()}
            history.append({**metrics, "step": step})
            now = time.monotonic()
            rate = (step - window_step) / max(now - window_start, 1e-9)
            window_start, window_step = now, step
            logger.info("step %d: %s (%.1f steps/s)", step, _format(metrics), rate)
        if step % checkpoint_every == 0 or step == num_steps:
            checkpoint(step, state, batches.position, metrics=metrics)
            last_saved = step
    if last_saved != step:  # num_steps == 0 on a fresh run, or already done
        checkpoint(step, state, batches.position, metrics=metrics)
    return TrainResult(step=step, checkpoint_path=checkpoint_path, metrics=metrics,
                       resumed_from=None if restored is None else restored.step, history=history)


def train_on_tpu(
    train_step: TrainStep,
    init_state: InitState,
    data: str | Sequence[str],
    *,
    tpu_type: str,
    batch_size: int,
    seq_len: int,
    num_steps: int,
    checkpoint_path: str,
    checkpoint_every: int = 100,
    seed: int = 0,
    field: str = "input_ids",
    log_every: int = 10,
    keep_checkpoints: int = 2,
    max_retries_preemption: int = 100,
    max_retries_failure: int = 3,
    runtime_env: dict | None = None,
    fresh_process: bool = True,
) -> TrainResult:
    """Run :func:`train_loop` on every host of a ``tpu_type`` slice, restarting after loss.

    Takes :func:`train_loop`'s arguments plus :func:`~marin.tpu.runner.run_on_tpu`'s.
    ``train_step`` and ``init_state`` must be picklable (module-level functions or
    ``functools.partial`` of them). Returns the checkpoint-writing host's result.
    """
    loop = functools.partial(
        train_loop, train_step, init_state, data,
        batch_size=batch_size, seq_len=seq_len, num_steps=num_steps, checkpoint_path=checkpoint_path,
        checkpoint_every=checkpoint_every, seed=seed, field=field, log_every=log_every,
        keep_checkpoints=keep_checkpoints,
    )
    results = run_on_tpu(
        functools.partial(_report_writer, loop), tpu_type,
        max_retries_preemption=max_retries_preemption, max_retries_failure=max_retries_failure,
        runtime_env=runtime_env, fresh_process=fresh_process,
    )
    return _writer_result(results)


def _report_writer(loop: Callable[[], TrainResult]) -> tuple[bool, TrainResult]:
    """One host's part of :func:`train_on_tpu`: the loop's result, tagged with whether this
    host wrote the checkpoints (the host whose result ``train_on_tpu`` returns)."""
    result = loop()
    return _is_checkpoint_writer(), result


def _writer_result(results: Sequence[tuple[bool, TrainResult]]) -> TrainResult:
    writers = [result for is_writer, result in results if is_writer]
    if len(writers) != 1:
        raise RuntimeError(f"expected exactly one checkpoint-writing host, got {len(writers)} of {len(results)}")
    return writers[0]


def _is_checkpoint_writer() -> bool:
    """Exactly one host writes checkpoints.

    On a real multi-host slice (``jax.process_count() > 1``) it is JAX process 0, whatever
    run_on_tpu's ``MARIN_TPU_HOST_ID`` says (the placement-group bundle index need not match
    JAX's process numbering). With one JAX process per host (no multi-host JAX) it is
    run_on_tpu's host 0.
    """
    import jax

    return _select_writer(jax.process_count(), jax.process_index(), os.environ.get(HOST_ID_ENV, "0"))


def _select_writer(process_count: int, process_index: int, host_id: str) -> bool:
    if process_count > 1:
        return process_index == 0
    return host_id == "0"


def _format(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
