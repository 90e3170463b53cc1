"""Sharded, asynchronous checkpoints of a training run, with orbax-checkpoint.

Layout under a checkpoint directory (a local path or ``gs://``)::

    100/state/...          the state's arrays: every host writes its own shards (tensorstore)
    100/meta/metadata      JSON: format, step, data position, last metrics, metrics history
    100/commit_success.txt orbax's completion marker
    200/...

What :class:`Checkpointer` guarantees, through orbax's ``CheckpointManager``:

- **Asynchronous**: ``save`` copies the arrays off the devices and returns; the write goes
  on in the background while training continues. The next ``save`` (or ``wait``/``close``)
  waits for the previous one first.
- **Visible only when complete**: a local save writes ``<step>.orbax-checkpoint-tmp`` and
  renames it when every host has finished; on ``gs://`` a step counts only once its commit
  marker exists. A save cut short (a preempted host) is never restored, and its leftovers
  are removed by the next run's checkpointer.
- **The last ``keep``** checkpoints are kept, older ones deleted.
- **Restore onto the mesh**: each array comes back with the sharding of the abstract state
  it is restored into (any mesh shape: a run checkpointed on 8 devices resumes on 4).
  A checkpoint of a different model (other leaf names, shapes or dtypes) is refused with a
  ``ValueError`` naming the leaves before anything is read; no checkpoint is modified.
- **Readers stay out of the way**: ``load_checkpoint`` and ``latest_step`` (and a
  ``Checkpointer(read_only=True)``) never create, clean up or delete anything, so an eval job
  can read a live run's directory while it saves.

Every host must call ``save``/``restore`` (they synchronise); only the state's own shards
are written by each host.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

import fsspec
import jax
import numpy as np

from marin.training.data import DataPosition, position_from_dict

__all__ = ["FORMAT", "Checkpoint", "Checkpointer", "latest_step", "load_checkpoint", "save_checkpoint"]

logger = logging.getLogger(__name__)

FORMAT = "marin.tpu.checkpoint/2"
_LEGACY_MARKER = "latest.json"  # marin.tpu.checkpoint/1: one .npz per step plus this marker


@dataclass(frozen=True)
class Checkpoint:
    """A restored checkpoint: the state (on the mesh), its step, and the data position."""

    step: int
    state: Any
    data_position: DataPosition
    metrics: dict[str, float] = field(default_factory=dict)
    path: str = ""
    history: list[dict] = field(default_factory=list)  # the metrics logged so far, one dict per log step
    data: dict = field(default_factory=dict)  # what the data position refers to (see train_loop)


class Checkpointer:
    """The checkpoints of one run in ``directory``: save (async), find, restore.

    >>> with Checkpointer("gs://b/run/ckpt", keep=3) as checkpoints:   # doctest: +SKIP
    ...     restored = checkpoints.restore(abstract_state)             # None on a fresh run
    ...     checkpoints.save(100, state, batches.position, metrics={"loss": 2.1})
    """

    def __init__(self, directory: str, *, keep: int = 2, async_save: bool = True, read_only: bool = False):
        import orbax.checkpoint as ocp

        if keep < 1:
            raise ValueError(f"keep must be positive, got {keep}")
        self.directory = directory.rstrip("/")
        _refuse_legacy(self.directory)
        _forget_listings(self.directory)  # orbax's leftover cleanup must see what is there now
        if read_only:  # a reader (an eval job, a tool) never touches a live run's in-flight save
            options = ocp.CheckpointManagerOptions(read_only=True, create=False, save_interval_steps=0)
        else:  # the run's writer: leftovers of a dead attempt's unfinished saves are removed
            options = ocp.CheckpointManagerOptions(
                max_to_keep=keep, enable_async_checkpointing=async_save, create=True, cleanup_tmp_directories=True,
            )
        self._manager = ocp.CheckpointManager(self.directory, options=options, item_names=("state", "meta"),
                                              item_handlers=_handlers())

    def latest_step(self) -> int | None:
        return self._manager.latest_step()

    @property
    def manager(self) -> Any:
        """The orbax ``CheckpointManager`` (for ``reached_preemption`` on multi-host runs)."""
        return self._manager

    def save(self, step: int, state: Any, data_position: DataPosition, *,
             metrics: dict[str, float] | None = None, history: list[dict] | None = None,
             data: dict | None = None) -> None:
        """Start writing checkpoint ``step`` (returns once the arrays are off the devices).

        ``data``: JSON-able facts about the data the position refers to, returned on restore.
        """
        import orbax.checkpoint as ocp

        meta = {
            "format": FORMAT,
            "step": int(step),
            "data_position": data_position.to_dict(),
            "metrics": {k: float(v) for k, v in (metrics or {}).items()},
            "history": [dict(point) for point in history or ()],
            "data": dict(data or {}),
        }
        args = ocp.args.Composite(state=ocp.args.StandardSave(state), meta=ocp.args.JsonSave(meta))
        if not self._manager.save(int(step), args=args, force=True):
            raise RuntimeError(f"{self.directory}: orbax declined to save step {step}")

    def restore(self, abstract_state: Any, step: int | None = None) -> Checkpoint | None:
        """The latest (or ``step``'s) complete checkpoint, restored into ``abstract_state``.

        ``abstract_state``: a pytree of ``jax.ShapeDtypeStruct`` (with ``sharding``) or arrays,
        as ``jax.eval_shape(init_state, key)`` gives with shardings attached. Returns None when
        there is no checkpoint.

        Raises:
            ValueError: the checkpoint holds a different model (names the differing leaves).
        """
        import orbax.checkpoint as ocp

        step = self._manager.latest_step() if step is None else step
        if step is None:
            return None
        path = f"{self.directory}/{step}"
        stored = self._manager.item_metadata(step)["state"]
        _check_compatible(stored, abstract_state, path)
        target = jax.tree_util.tree_map(_restore_target, abstract_state)
        restored = self._manager.restore(
            step, args=ocp.args.Composite(state=ocp.args.StandardRestore(target), meta=ocp.args.JsonRestore()),
        )
        meta = restored["meta"]
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}, expected {FORMAT!r}")
        return Checkpoint(
            step=int(meta["step"]),
            state=restored["state"],
            data_position=position_from_dict(meta["data_position"]),
            metrics=meta.get("metrics", {}),
            path=path,
            history=meta.get("history", []),
            data=meta.get("data", {}),
        )

    def wait(self) -> None:
        """Block until the last save is complete (and raise if it failed)."""
        self._manager.wait_until_finished()

    def close(self) -> None:
        self._manager.close()

    def __enter__(self) -> Checkpointer:
        return self

    def __exit__(self, exc_type, exc, traceback) -> None:
        if exc is None:
            self.close()
            return
        try:  # an error is on its way out: a failing close (a broken background save) must not mask it
            self.close()
        except Exception as close_error:  # noqa: BLE001
            logger.warning("%s: closing the checkpointer after an error failed too: %s", self.directory, close_error)


def _handlers() -> dict:
    import orbax.checkpoint as ocp

    return {"state": ocp.StandardCheckpointHandler(), "meta": ocp.JsonCheckpointHandler()}


def latest_step(directory: str) -> int | None:
    """The step of the latest complete checkpoint in ``directory``, or None. Writes nothing."""
    import orbax.checkpoint as ocp

    _forget_listings(directory)
    try:
        steps = ocp.path.step.checkpoint_steps(directory)
    except (FileNotFoundError, ValueError):
        return None
    return max(steps) if steps else None


def load_checkpoint(directory: str, template: Any, step: int | None = None) -> Checkpoint | None:
    """Restore the latest (or ``step``'s) checkpoint into ``template``'s structure, or None.

    ``template`` leaves are arrays or ``ShapeDtypeStruct``s; those without a sharding come
    back replicated on every device. Read-only: safe beside a live run that is saving.
    """
    if latest_step(directory) is None:
        _refuse_legacy(directory)
        return None
    with Checkpointer(directory, read_only=True) as checkpoints:
        return checkpoints.restore(template, step)


def save_checkpoint(directory: str, step: int, state: Any, data_position: DataPosition, *,
                    metrics: dict[str, float] | None = None, keep: int = 2,
                    history: list[dict] | None = None) -> str:
    """Write checkpoint ``step`` synchronously (for tools and tests); return its path."""
    with Checkpointer(directory, keep=keep, async_save=False) as checkpoints:
        checkpoints.save(step, state, data_position, metrics=metrics, history=history)
        checkpoints.wait()
    return f"{directory.rstrip('/')}/{step}"


def _restore_target(leaf: Any) -> jax.ShapeDtypeStruct:
    """What orbax should produce for one leaf: its shape, dtype and sharding on this run's devices."""
    sharding = getattr(leaf, "sharding", None)
    if sharding is None:
        mesh = jax.sharding.Mesh(jax.devices(), ("replica",))
        sharding = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())
    shape, dtype = getattr(leaf, "shape", ()), getattr(leaf, "dtype", None)
    if dtype is None:  # a Python scalar in a concrete template
        leaf = jax.numpy.asarray(leaf)
        shape, dtype = leaf.shape, leaf.dtype
    return jax.ShapeDtypeStruct(shape, dtype, sharding=sharding)


def _check_compatible(stored: Any, abstract_state: Any, path: str) -> None:
    """Refuse a checkpoint whose leaves differ from the state's, naming them."""
    saved = {_name(key_path): leaf for key_path, leaf in _leaves(getattr(stored, "tree", stored))
             if hasattr(leaf, "shape")}  # empty containers (optax's EmptyState) show up as placeholders
    wanted = {_name(key_path): _stored_form(leaf) for key_path, leaf in _leaves(abstract_state)}
    problems = [f"missing from the checkpoint: {name}" for name in sorted(wanted.keys() - saved.keys())]
    problems += [f"not in the state: {name}" for name in sorted(saved.keys() - wanted.keys())]
    for name in sorted(wanted.keys() & saved.keys()):
        (shape, dtype), leaf = wanted[name], saved[name]
        got = (tuple(getattr(leaf, "shape", ()) or ()), _dtype_name(getattr(leaf, "dtype", None)))
        if got == (shape, _dtype_name(dtype)) or (got[0] == shape == () and _same_kind(got[1], dtype)):
            continue  # a Python scalar is stored as 64-bit; it is cast back to the state's dtype
        problems.append(f"{name} is {got[1]}{list(got[0])} in the checkpoint but {_dtype_name(dtype)}{list(shape)} in the state")
    if problems:
        shown = "; ".join(problems[:6]) + (f"; ... {len(problems) - 6} more" if len(problems) > 6 else "")
        raise ValueError(f"{path}: checkpoint does not match the state (was it written by a different model?): {shown}")


def _leaves(tree: Any) -> list:
    return jax.tree_util.tree_flatten_with_path(tree)[0]


def _name(key_path) -> str:
    parts = []
    for key in key_path:
        for attr in ("key", "name", "idx"):
            if hasattr(key, attr):
                parts.append(str(getattr(key, attr)))
                break
        else:
            parts.append(str(key))
    return ".".join(parts)


def _stored_form(leaf: Any) -> tuple[tuple[int, ...], Any]:
    """Shape and dtype as orbax stores ``leaf`` (a typed PRNG key as its key data)."""
    dtype = getattr(leaf, "dtype", None)
    if dtype is None:
        leaf = jax.numpy.asarray(leaf)
        dtype = leaf.dtype
    if jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        data = jax.eval_shape(jax.random.key_data, jax.ShapeDtypeStruct(leaf.shape, dtype))
        return tuple(data.shape), data.dtype
    return tuple(leaf.shape), dtype


def _same_kind(a: Any, b: Any) -> bool:
    try:
        return np.dtype(a).kind == np.dtype(b).kind
    except TypeError:
        return False


def _dtype_name(dtype: Any) -> str:
    try:
        return np.dtype(dtype).name
    except TypeError:
        return str(dtype)


def _forget_listings(directory: str) -> None:
    """Drop cached directory listings of object stores (gcsfs caches them per instance, and
    orbax reaches gs:// through etils' own instance): a long-lived process must see the
    checkpoints other processes wrote, and the leftovers they did not finish."""
    protocol = fsspec.core.split_protocol(directory)[0]
    if protocol in (None, "file", "local"):
        return
    for kwargs in ({}, {"finalize_on_close": True}):  # ours, and the one etils.epath uses for gs://
        try:
            fsspec.filesystem(protocol, **kwargs).invalidate_cache()
        except (TypeError, ValueError, ImportError):
            continue


def _refuse_legacy(directory: str) -> None:
    """A directory of the earlier single-file (.npz) format cannot be resumed: say so."""
    fs, fs_path = fsspec.core.url_to_fs(directory)
    if fs.exists(f"{fs_path}/{_LEGACY_MARKER}") and latest_step(directory) is None:
        raise ValueError(
            f"{directory} holds checkpoints in the earlier .npz format (marin.tpu.checkpoint/1, {_LEGACY_MARKER}); "
            "this version writes sharded orbax checkpoints and cannot resume from it: point checkpoint_path "
            "at a new directory (the old files are left untouched)"
        )
