"""The training-step adapter: a resumable JAX training loop over every device of a slice.

The user supplies the model as two functions:

- ``init_state(key) -> state``: builds the initial training state (params, optimizer state,
  anything else) from a PRNG key (``jax.random.key(seed)``). It must be deterministic and
  traceable: the loop runs it under ``jax.jit`` with the state's output shardings, and
  ``jax.eval_shape`` of it is how a resumed run learns the state's structure.
- ``train_step(state, batch) -> (state, metrics)``: one optimisation step, ``jax.jit``-ed by
  the user. ``batch`` is the global int32 ``[batch_size, seq_len]`` batch as one ``jax.Array``
  sharded along its rows over the mesh's ``"data"`` axis, so jit runs the step data-parallel
  on every device (GSPMD inserts the gradient all-reduce). ``metrics`` is a dict of scalars.

:func:`train_loop` runs in every process of the run (one per host): it builds a mesh over
all devices (:mod:`marin.training.mesh`), puts the state on it (replicated, or as
``state_sharding`` says), restores the latest complete checkpoint or initialises, and per
step reads this host's rows of the global batch (a background thread reads ahead),
assembles the global batch with ``jax.make_array_from_process_local_data``, and calls
``train_step``. Checkpoints (:mod:`marin.training.checkpoint`, orbax) are asynchronous: training
continues while one is written. :func:`train_on_tpu` runs the loop on every host of a slice
through :func:`~marin.tpu.runner.run_on_tpu`, which joins the hosts into one multi-host JAX
program, so a preempted run restarts on a fresh slice and continues from its last
checkpoint. With a deterministic ``train_step`` the result equals an uninterrupted run's.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin.training.data import DataPosition, TokenBatches, resolve_shards
from marin.training.preemption import PreemptionWatch, TrainingPreempted
from marin.training.token_cache import CacheBatches, MixtureBatches, is_token_cache, ledger_path, read_ledger
from marin.training.mesh import (
    DATA_AXIS,
    StateSharding,
    batch_sharding,
    check_batch_size,
    make_mesh,
    process_rows,
    state_shardings,
)
from marin.tpu.slices import HOST_ID_ENV

__all__ = ["TrainResult", "train_loop", "train_on_tpu"]

logger = logging.getLogger(__name__)

TrainStep = Callable[[Any, Any], tuple[Any, dict]]
InitState = Callable[[Any], Any]
PREFETCH_BATCHES = 2


@dataclass(frozen=True)
class TrainResult:
    """What a finished training run reports (from JAX process 0)."""

    step: int
    checkpoint_path: str
    metrics: dict[str, float] = field(default_factory=dict)
    resumed_from: int | None = None
    history: list[dict] = field(default_factory=list)  # {"step": n, **metrics} every log_every steps
    mesh: dict[str, int] = field(default_factory=dict)  # axis name -> size, e.g. {"data": 8}
    num_processes: int = 1


def train_loop(
    train_step: TrainStep,
    init_state: InitState,
    data: str | Sequence[str] | Mapping[str, float],
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
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] = (DATA_AXIS,),
    state_sharding: StateSharding = None,
    async_checkpoints: bool = True,
    mesh: Any = None,
) -> TrainResult:
    """Train for ``num_steps`` total steps on every device of the run, resuming from ``checkpoint_path``.

    Every process of a multi-host run calls it (``train_on_tpu`` does); a one-host run is the
    same call in one process.

    Args:
        train_step: ``(state, batch) -> (state, metrics)``, jitted by you.
        init_state: ``key -> state``, called (jitted) with ``jax.random.key(seed)``.
        data: a token cache (its folder or ``ledger.json``; each host reads only its rows'
            bytes, see :mod:`marin.training.token_cache`), or a glob or a list of paths/globs of
            tokenized JSONL or Parquet shards, or a mixture ``{cache: weight, ...}`` of token
            caches (:class:`~marin.training.token_cache.MixtureBatches`).
        batch_size, seq_len: the shape of each global batch; ``batch_size`` must divide
            evenly over the mesh's ``"data"`` axis.
        num_steps: the total number of steps of the run (not of this attempt).
        checkpoint_path: a directory URL (local or ``gs://``) for checkpoints.
        checkpoint_every: steps between checkpoints; one is also written at the end.
        seed: the PRNG seed for ``init_state``.
        field: the record field that holds the token ids.
        log_every: steps between metric log lines (``logging`` at INFO on ``marin.training.train``).
        keep_checkpoints: how many complete checkpoints to keep.
        mesh_shape, axis_names: the device mesh (default: every device on ``("data",)``;
            e.g. ``(4, 2), ("data", "model")``). The product must equal the device count.
        state_sharding: ``None`` (replicated), a pytree of ``PartitionSpec`` matching the state
            (or a prefix of it), or a function of the abstract state returning one, e.g.
            :func:`marin.training.mesh.fsdp_sharding`.
        async_checkpoints: write checkpoints in the background (default).
        mesh: a ready ``jax.sharding.Mesh`` with a ``"data"`` axis, instead of ``mesh_shape``
            and ``axis_names`` (e.g. from ``jax.make_mesh`` for a topology-aware layout, or
            over a subset of the devices).

    On a preemption notice (SIGTERM; orbax's synced check on several hosts) it saves the
    step just finished, waits for the save and raises
    :class:`~marin.training.preemption.TrainingPreempted` (a ``SystemExit``, code 143); calling
    again resumes from that step (:mod:`marin.training.preemption`).

    Raises:
        ValueError: bad counts, ``batch_size`` not divisible by the data axis, a mesh that
            does not match the devices, a checkpoint of a different model, one whose data
            position refers to other shards or another batch shape, or one past ``num_steps``
            (all before any step; no checkpoint is modified).
        FileNotFoundError: if ``data`` matches no files.
    """
    import jax

    from marin.training.checkpoint import Checkpointer

    _check_counts(batch_size=batch_size, seq_len=seq_len, checkpoint_every=checkpoint_every, log_every=log_every,
                  keep_checkpoints=keep_checkpoints, num_steps=num_steps)
    source = _resolve_data(data)
    mesh = _resolve_mesh(mesh, mesh_shape, axis_names)
    check_batch_size(batch_size, mesh)
    rows_sharding, global_shape = batch_sharding(mesh), (batch_size, seq_len)
    key = jax.random.key(seed)
    abstract, shardings = _abstract_state(init_state, key, state_sharding, mesh)
    data_facts = _data_facts(source, batch_size, seq_len, field)
    with Checkpointer(checkpoint_path, keep=keep_checkpoints, async_save=async_checkpoints) as checkpoints, \
            jax.set_mesh(mesh):
        run = _restore_or_start(checkpoints, abstract, lambda: jax.jit(init_state, out_shardings=shardings)(key),
                                data_facts, mesh, len(source.shards))
        if run.step > num_steps:
            raise ValueError(
                f"the checkpoint in {checkpoint_path} is at step {run.step}, past num_steps={num_steps}: "
                "give the run's total num_steps, or another checkpoint_path for a new run"
            )
        batches = source.batches(batch_size, seq_len, field, run.position, process_rows(rows_sharding, global_shape))
        run.position = batches.position
        schedule = _Schedule(num_steps, log_every, checkpoint_every)
        _run_steps(train_step, batches, run, schedule,
                   lambda rows: jax.make_array_from_process_local_data(rows_sharding, rows, global_shape),
                   checkpoint_path)
        if run.last_saved != run.step:  # num_steps == 0 on a fresh run
            run.save()
        checkpoints.wait()
    return TrainResult(step=run.step, checkpoint_path=checkpoint_path, metrics=run.metrics,
                       resumed_from=run.resumed_from, history=run.history, mesh=dict(mesh.shape),
                       num_processes=jax.process_count())


def _check_counts(*, num_steps: int, **positive: int) -> None:
    for name, value in positive.items():
        if value < 1:
            raise ValueError(f"{name} must be positive, got {value}")
    if num_steps < 0:
        raise ValueError(f"num_steps must be >= 0, got {num_steps}")


@dataclass(frozen=True)
class _Data:
    """Where the batches come from: a weighted mixture of token caches, one cache, or shards."""

    shards: list[str]  # what a saved data position refers to (their names go into the checkpoint)
    mixture: list[tuple[str, float]] | None = None
    cache: str | None = None
    sizes: list[int] | None = None  # of JSON/Parquet shards, in bytes (they go into the checkpoint too)

    def batches(self, batch_size: int, seq_len: int, field: str, position: Any, rows: Any):
        """This host's reader of its ``rows`` of every global batch, from ``position`` on."""
        shape = {"batch_size": batch_size, "seq_len": seq_len, "position": position, "rows": rows}
        if self.mixture:
            return MixtureBatches(self.mixture, **shape)
        if self.cache:
            return CacheBatches(self.cache, **shape)
        return TokenBatches(self.shards, field=field, **shape)


def _resolve_data(data: str | Sequence[str] | Mapping[str, float]) -> _Data:
    if isinstance(data, Mapping):
        mixture = [(source, float(weight)) for source, weight in data.items()]
        return _Data([f"{ledger_path(s)}*{w!r}" for s, w in mixture], mixture=mixture)
    if is_token_cache(data):
        cache = ledger_path(data)
        return _Data([cache], cache=cache)
    shards = resolve_shards(data)
    return _Data(shards, sizes=_shard_sizes(shards))


def _shard_sizes(paths: list[str]) -> list[int]:
    """Each shard's size in bytes, from the listing the glob just cached on object stores: a
    copy of the shards keeps them, a rewrite with other tokens almost never does."""
    from concurrent.futures import ThreadPoolExecutor

    from zephyr.io.files import file_size

    with ThreadPoolExecutor(max_workers=min(16, len(paths))) as pool:
        return list(pool.map(file_size, paths))


def _resolve_mesh(mesh: Any, mesh_shape: Sequence[int] | None, axis_names: Sequence[str]) -> Any:
    if mesh is None:
        return make_mesh(mesh_shape, axis_names)
    if DATA_AXIS not in mesh.axis_names:
        raise ValueError(f"mesh must have a {DATA_AXIS!r} axis (the batch axis), got axes {mesh.axis_names}")
    return mesh


def _abstract_state(init_state: InitState, key: Any, state_sharding: StateSharding, mesh: Any) -> tuple[Any, Any]:
    """The state's structure (shapes, dtypes, shardings), traced without computing it, and its shardings."""
    import jax

    abstract = jax.eval_shape(init_state, key)
    shardings = state_shardings(state_sharding, abstract, mesh)
    abstract = jax.tree_util.tree_map(
        lambda leaf, sharding: jax.ShapeDtypeStruct(leaf.shape, leaf.dtype, sharding=sharding), abstract, shardings,
    )
    return abstract, shardings


@dataclass
class _Run:
    """Where a training run is: what each checkpoint holds, and the last step saved."""

    checkpoints: Any  # the run's Checkpointer
    data_facts: dict
    state: Any
    step: int = 0
    position: DataPosition | None = None
    metrics: dict = field(default_factory=dict)
    history: list = field(default_factory=list)
    resumed_from: int | None = None
    last_saved: int | None = None

    def save(self) -> None:
        self.checkpoints.save(self.step, self.state, self.position, metrics=self.metrics, history=self.history,
                              data=self.data_facts)
        self.last_saved = self.step


def _restore_or_start(checkpoints: Any, abstract: Any, init: Callable[[], Any], data_facts: dict, mesh: Any,
                      num_shards: int) -> _Run:
    """The latest complete checkpoint (refused when it read other data), else a fresh state at step 0."""
    import jax

    restored = checkpoints.restore(abstract)
    if restored is None:
        logger.info("starting at step 0 on %d %s devices, mesh %s (%d shards)", jax.device_count(),
                    jax.default_backend(), dict(mesh.shape), num_shards)
        return _Run(checkpoints, data_facts, init())
    _check_same_data(restored.data, data_facts, restored.path)
    logger.info("resuming at step %d from %s (data at %s), mesh %s", restored.step, restored.path,
                restored.data_position, dict(mesh.shape))
    return _Run(checkpoints, data_facts, restored.state, restored.step, restored.data_position, restored.metrics,
                list(restored.history), resumed_from=restored.step, last_saved=restored.step)


@dataclass(frozen=True)
class _Schedule:
    num_steps: int
    log_every: int
    checkpoint_every: int

    def logs(self, step: int) -> bool:
        return step % self.log_every == 0 or step == self.num_steps

    def saves(self, step: int) -> bool:
        return step % self.checkpoint_every == 0 or step == self.num_steps


def _run_steps(train_step: TrainStep, batches: Any, run: _Run, schedule: _Schedule,
               to_global: Callable[[Any], Any], checkpoint_path: str) -> None:
    """Step until ``schedule.num_steps``: log, checkpoint, and on a preemption notice save and exit."""
    import jax

    window_start, window_step = time.monotonic(), run.step
    with _Prefetcher(batches, PREFETCH_BATCHES) as prefetched, PreemptionWatch(jax.process_count()) as watch:
        while run.step < schedule.num_steps:
            rows, run.position = next(prefetched)
            run.state, step_metrics = train_step(run.state, to_global(rows))
            run.step += 1
            if schedule.logs(run.step):
                run.metrics = _host_scalars(step_metrics)
                run.history.append({**run.metrics, "step": run.step})
                now = time.monotonic()
                rate = (run.step - window_step) / max(now - window_start, 1e-9)
                window_start, window_step = now, run.step
                logger.info("step %d: %s (%.1f steps/s)", run.step, _format(run.metrics), rate)
            if schedule.saves(run.step):
                run.save()
            if run.step < schedule.num_steps and watch.requested(run.step, run.checkpoints.manager):
                if run.last_saved != run.step:
                    run.save()
                run.checkpoints.wait()
                logger.warning("preemption notice: saved step %d, exiting", run.step)
                raise TrainingPreempted(run.step, checkpoint_path)


def _data_facts(data: _Data, batch_size: int, seq_len: int, field: str) -> dict:
    """What a saved data position means: which shards (by name and size, in order) and how they
    are cut; for token caches (one, or a mixture's), what their ledgers list: each shard's name,
    tokens and documents, in order (every cache's ledger has the same name). Names without their
    folders and sizes, not paths: a copy of the data elsewhere still resumes."""
    names = "\n".join(path.rstrip("/").rsplit("/", 1)[-1] for path in data.shards)
    facts = {"num_shards": len(data.shards), "shard_names_sha256": hashlib.sha256(names.encode()).hexdigest(),
             "batch_size": batch_size, "seq_len": seq_len, "field": field}
    if data.sizes is not None:
        facts["shard_sizes_sha256"] = hashlib.sha256(json.dumps(data.sizes).encode()).hexdigest()
    caches = [source for source, _ in data.mixture] if data.mixture else [data.cache] if data.cache else []
    if caches:
        listed = [[[s["path"].rsplit("/", 1)[-1], s["tokens"], s.get("documents")] for s in read_ledger(cache)["shards"]]
                  for cache in caches]
        facts["ledgers_sha256"] = hashlib.sha256(json.dumps(listed).encode()).hexdigest()
    return facts


def _check_same_data(saved: dict, now: dict, path: str) -> None:
    """Refuse to resume on other data: the position indexes the sorted shard list."""
    changed = [f"{key} {saved[key]!r} -> {now[key]!r}" for key in now if key in saved and saved[key] != now[key]]
    if changed:
        raise ValueError(
            f"{path}: the checkpoint's data position refers to other data than this run's ({'; '.join(changed)}); "
            "resuming would read different batches. Keep the shard list and batch shape of the run, or start "
            "in a new checkpoint_path"
        )


class _Prefetcher:
    """Reads the next batches on a background thread while the devices compute.

    Yields ``(rows, position_after)``; an error in the reader is raised by ``next``.
    """

    def __init__(self, batches: TokenBatches, depth: int):
        self._batches = batches
        self._queue: queue.Queue = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._fill, name="marin-batches", daemon=True)
        self._thread.start()

    def _fill(self) -> None:
        try:
            while not self._stop.is_set():
                self._put((next(self._batches), self._batches.position))
        except BaseException as e:  # noqa: BLE001 - handed to the consumer
            self._put(_ReaderError(e))

    def _put(self, item: Any) -> None:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return
            except queue.Full:
                continue

    def __next__(self) -> tuple[Any, DataPosition]:
        item = self._queue.get()
        if isinstance(item, _ReaderError):
            raise item.error
        return item

    def __enter__(self) -> _Prefetcher:
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(timeout=60)


@dataclass(frozen=True)
class _ReaderError:
    error: BaseException


def _host_scalars(metrics: dict) -> dict[str, float]:
    """Metrics as Python floats on every host (replicated scalars need no communication)."""
    import jax

    def local(value: Any) -> Any:
        if isinstance(value, jax.Array) and not value.is_fully_addressable:
            if value.is_fully_replicated:
                return value.addressable_data(0)
            from jax.experimental import multihost_utils

            return multihost_utils.process_allgather(value, tiled=True)
        return value

    # one device_get for all of them: a transfer and a wait per metric cost a step of a few ms ~0.1 ms
    fetched = jax.device_get({name: local(value) for name, value in metrics.items()})
    return {name: float(np.asarray(value)) for name, value in fetched.items()}


def train_on_tpu(
    train_step: TrainStep,
    init_state: InitState,
    data: str | Sequence[str] | Mapping[str, float],
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
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] = (DATA_AXIS,),
    state_sharding: StateSharding = None,
    async_checkpoints: bool = True,
    max_retries_preemption: int = 100,
    max_retries_failure: int = 3,
    runtime_env: dict | None = None,
    fresh_process: bool = True,
) -> TrainResult:
    """Run :func:`train_loop` on every host of a ``tpu_type`` slice, restarting after loss.

    Takes :func:`train_loop`'s arguments plus :func:`~marin.tpu.runner.run_on_tpu`'s. On a
    multi-host slice the hosts form one JAX program (``run_on_tpu`` initialises
    ``jax.distributed``), so the mesh spans every chip of the slice. ``train_step``,
    ``init_state`` and ``state_sharding`` must be picklable (module-level functions or
    ``functools.partial`` of them). Returns JAX process 0's result.
    """
    loop = functools.partial(
        train_loop, train_step, init_state, data,
        batch_size=batch_size, seq_len=seq_len, num_steps=num_steps, checkpoint_path=checkpoint_path,
        checkpoint_every=checkpoint_every, seed=seed, field=field, log_every=log_every,
        keep_checkpoints=keep_checkpoints, mesh_shape=mesh_shape, axis_names=axis_names,
        state_sharding=state_sharding, async_checkpoints=async_checkpoints,
    )
    from marin.tpu import runner  # Ray: only for the slice launcher, so train_loop runs on a host without it

    results = runner.run_on_tpu(
        functools.partial(_tag_reporter, loop), tpu_type,
        max_retries_preemption=max_retries_preemption, max_retries_failure=max_retries_failure,
        runtime_env=runtime_env, fresh_process=fresh_process,
    )
    return _reporter_result(results)


def _tag_reporter(loop: Callable[[], TrainResult]) -> tuple[bool, TrainResult]:
    """One host's part of :func:`train_on_tpu`: the loop's result, tagged with whether this
    host is the one whose result ``train_on_tpu`` returns."""
    result = loop()
    return _is_reporting_host(), result


def _reporter_result(results: Sequence[tuple[bool, TrainResult]]) -> TrainResult:
    reporters = [result for is_reporter, result in results if is_reporter]
    if len(reporters) != 1:
        raise RuntimeError(f"expected exactly one reporting host (JAX process 0), got {len(reporters)} of {len(results)}")
    return reporters[0]


def _is_reporting_host() -> bool:
    """Exactly one host reports: JAX process 0 of a multi-host program (whatever its
    ``MARIN_TPU_HOST_ID``: the placement-group bundle index need not match JAX's process
    numbering), or ``run_on_tpu``'s host 0 when each host runs JAX on its own."""
    import jax

    return _select_reporter(jax.process_count(), jax.process_index(), os.environ.get(HOST_ID_ENV, "0"))


def _select_reporter(process_count: int, process_index: int, host_id: str) -> bool:
    if process_count > 1:
        return process_index == 0
    return host_id == "0"


def _format(metrics: dict[str, float]) -> str:
    return ", ".join(f"{k}={v:.4g}" for k, v in sorted(metrics.items()))
