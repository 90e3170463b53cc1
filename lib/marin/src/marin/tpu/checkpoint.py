"""Atomic, single-file checkpoints of a JAX pytree plus the data position.

Layout under a checkpoint directory (any fsspec URL: a local path, ``gs://``, ``memory://``)::

    step-00000100.npz     one file per checkpoint: every leaf as an array, plus metadata
    step-00000200.npz
    latest.json           {"step": 200, "file": "step-00000200.npz"}, written last

A checkpoint file is written atomically (``zephyr.io.atomic_write``: a temporary name plus
``os.replace`` on local disk; a single upload on object stores, where an object appears
only when complete). ``latest.json`` is the commit point: it is written, also atomically,
only after the checkpoint file is in place, so a reader never follows it to a partial
checkpoint; files newer than it (a writer killed in between) are ignored and overwritten by
the next run. After a commit, checkpoints older than the newest ``keep`` are deleted.

Leaves are stored in ``jax.tree_util`` flatten order; loading needs a *template* pytree of
the same structure (e.g. the freshly initialised state), which also gives the dtypes.
Typed PRNG key leaves are stored as their key data. Each leaf's dtype name is kept in the
metadata: ``bfloat16`` and the other ``ml_dtypes`` types (which ``.npz`` cannot describe) are
stored as raw unsigned integers of the same width and viewed back on load; Python-scalar
leaves (a float learning rate, an int counter) are stored as the dtype JAX gives them and
cast to the template's dtype on load. Multi-host: non-fully-addressable
arrays are gathered first (every host must call :func:`save_checkpoint`; only the writer
writes).
"""

from __future__ import annotations

import io
import json
import re
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from marin.tpu.data import DataPosition

__all__ = ["FORMAT", "LATEST", "Checkpoint", "latest_step", "load_checkpoint", "save_checkpoint"]

FORMAT = "marin.tpu.checkpoint/1"
LATEST = "latest.json"
_META_KEY = "__meta__"
_FILE_RE = re.compile(r"step-(\d{8,})\.npz$")


@dataclass(frozen=True)
class Checkpoint:
    """A loaded checkpoint: the state (template structure), its step, and the data position."""

    step: int
    state: Any
    data_position: DataPosition
    metrics: dict[str, float] = field(default_factory=dict)
    path: str = ""
    history: list[dict] = field(default_factory=list)  # the metrics logged so far, one dict per log step


def _join(directory: str, name: str) -> str:
    return f"{directory.rstrip('/')}/{name}"


def _file_name(step: int) -> str:
    return f"step-{step:08d}.npz"


def save_checkpoint(
    directory: str,
    step: int,
    state: Any,
    data_position: DataPosition,
    *,
    metrics: dict[str, float] | None = None,
    keep: int = 2,
    write: bool = True,
    history: list[dict] | None = None,
) -> str:
    """Write ``state`` as checkpoint ``step`` and commit it as the latest; return its path.

    Holds one host copy of the state in memory while writing. ``write=False`` only takes
    part in the multi-host gather (for hosts other than the writer).
    """
    import jax

    converted = [_to_numpy(leaf) for leaf in jax.tree_util.tree_leaves(state)]
    path = _join(directory, _file_name(step))
    if not write:
        return path
    leaves = [_storable(array) for array, _ in converted]
    meta = {
        "format": FORMAT,
        "step": int(step),
        "num_leaves": len(leaves),
        "key_leaves": {str(i): impl for i, (_, impl) in enumerate(converted) if impl is not None},
        "dtypes": [array.dtype.name for array, _ in converted],
        "data_position": data_position.to_dict(),
        "metrics": {k: float(v) for k, v in (metrics or {}).items()},
        "history": list(history or []),
    }
    arrays = {f"leaf_{i:05d}": array for i, array in enumerate(leaves)}
    arrays[_META_KEY] = np.frombuffer(json.dumps(meta).encode(), dtype=np.uint8)
    buffer = io.BytesIO()
    np.savez(buffer, **arrays)
    _write_bytes(path, buffer.getvalue())
    _write_bytes(_join(directory, LATEST), json.dumps({"step": int(step), "file": _file_name(step)}).encode())
    _prune(directory, keep=keep, newest=step)
    return path


def latest_step(directory: str) -> int | None:
    """The step of the latest committed checkpoint in ``directory``, or None if there is none."""
    marker = _read_marker(directory)
    return None if marker is None else int(marker["step"])


def load_checkpoint(directory: str, template: Any) -> Checkpoint | None:
    """Load the latest committed checkpoint into ``template``'s structure, or None if none.

    Raises:
        ValueError: if the checkpoint does not match the template (leaf count, shape, dtype).
    """
    import jax

    marker = _read_marker(directory)
    if marker is None:
        return None
    path = _join(directory, marker["file"])
    with np.load(io.BytesIO(_read_bytes(path)), allow_pickle=False) as npz:
        meta = json.loads(npz[_META_KEY].tobytes())
        if meta.get("format") != FORMAT:
            raise ValueError(f"{path}: unknown checkpoint format {meta.get('format')!r}, expected {FORMAT!r}")
        stored = [npz[f"leaf_{i:05d}"] for i in range(meta["num_leaves"])]
    dtype_names = meta.get("dtypes")
    if dtype_names is not None:
        stored = [_restore_dtype(array, name) for array, name in zip(stored, dtype_names, strict=True)]
    with_paths, treedef = jax.tree_util.tree_flatten_with_path(template)
    template_leaves = [leaf for _, leaf in with_paths]
    names = [f"{i} ({jax.tree_util.keystr(key_path)})" for i, (key_path, _) in enumerate(with_paths)]
    if len(stored) != len(template_leaves):
        raise ValueError(
            f"{path}: checkpoint has {len(stored)} leaves but the state template has {len(template_leaves)}; "
            "was it written by a different model?"
        )
    key_leaves = meta.get("key_leaves", {})
    leaves = [
        _from_numpy(array, like, key_leaves.get(str(i)), path, names[i])
        for i, (array, like) in enumerate(zip(stored, template_leaves, strict=True))
    ]
    return Checkpoint(
        step=int(meta["step"]),
        state=jax.tree_util.tree_unflatten(treedef, leaves),
        data_position=DataPosition.from_dict(meta["data_position"]),
        metrics=meta.get("metrics", {}),
        path=path,
        history=meta.get("history", []),
    )


def _to_numpy(leaf: Any) -> tuple[np.ndarray, str | None]:
    """A host copy of one leaf, and the PRNG implementation's name if it is a typed key."""
    import jax

    impl = None
    if isinstance(leaf, bool | int | float | complex):
        # The dtype jax.eval_shape reports for it (float32/int32 unless x64 is on).
        return np.asarray(jax.numpy.asarray(leaf)), None
    if isinstance(leaf, jax.Array):
        if jax.dtypes.issubdtype(leaf.dtype, jax.dtypes.prng_key):
            impl = str(jax.random.key_impl(leaf))
            leaf = jax.random.key_data(leaf)
        if not leaf.is_fully_addressable:
            from jax.experimental import multihost_utils

            leaf = multihost_utils.process_allgather(leaf, tiled=True)
    return np.asarray(jax.device_get(leaf)), impl


def _storable(array: np.ndarray) -> np.ndarray:
    """``array`` as ``np.savez`` can store it: dtypes numpy does not know natively (bfloat16,
    float8, int4, ... from ``ml_dtypes``) as raw unsigned integers of the same width."""
    if array.dtype.isbuiltin == 1:
        return array
    return array.view(np.dtype(f"u{array.dtype.itemsize}"))


def _restore_dtype(array: np.ndarray, name: str) -> np.ndarray:
    """Undo :func:`_storable` with the dtype name recorded at save time."""
    if array.dtype.name == name:
        return array
    return array.view(_dtype_from_name(name))


def _dtype_from_name(name: str) -> np.dtype:
    try:
        return np.dtype(name)
    except TypeError:
        import ml_dtypes

        return np.dtype(getattr(ml_dtypes, name))


def _from_numpy(array: np.ndarray, like: Any, key_impl: str | None, path: str, name: str) -> Any:
    """One restored leaf, checked against the template leaf (an array or ShapeDtypeStruct)."""
    import jax

    if key_impl is not None:
        return jax.random.wrap_key_data(array, impl=key_impl)
    if hasattr(like, "shape") and hasattr(like, "dtype"):
        if array.ndim == 0 and tuple(like.shape) == () and _same_kind(array.dtype, np.dtype(like.dtype)):
            # A scalar (a Python float/int in the state, or one saved with x64 on): cast it.
            array = array.astype(like.dtype)
        _check_leaf(array, like.shape, like.dtype, path, name)
        return array
    return array.item() if array.ndim == 0 else array


def _same_kind(a: np.dtype, b: np.dtype) -> bool:
    def kind(dtype: np.dtype) -> str:
        if dtype.kind in "iu":
            return "int"
        if dtype.kind == "f" or dtype.name in ("bfloat16",) or "float8" in dtype.name:
            return "float"
        return dtype.kind

    return kind(a) == kind(b)


def _check_leaf(array: np.ndarray, shape, dtype, path: str, name: str) -> None:
    if tuple(array.shape) != tuple(shape) or np.dtype(array.dtype) != np.dtype(dtype):
        raise ValueError(
            f"{path}: leaf {name} is {array.dtype}{list(array.shape)} but the state template has "
            f"{np.dtype(dtype)}{list(shape)}"
        )


def _write_bytes(path: str, data: bytes) -> None:
    from zephyr.io import atomic_write

    with atomic_write(path) as out:
        out.write(data)


def _read_bytes(path: str) -> bytes:
    import fsspec

    fs, fs_path = fsspec.core.url_to_fs(path)
    return fs.cat_file(fs_path)


def _read_marker(directory: str) -> dict | None:
    try:
        return json.loads(_read_bytes(_join(directory, LATEST)))
    except FileNotFoundError:
        return None


def _prune(directory: str, *, keep: int, newest: int) -> None:
    import fsspec

    fs, fs_path = fsspec.core.url_to_fs(directory)
    fs.invalidate_cache(fs_path)
    steps = []
    for name in fs.ls(fs_path, detail=False):
        match = _FILE_RE.search(name)
        if match and int(match.group(1)) <= newest:
            steps.append((int(match.group(1)), name))
    for _, name in sorted(steps)[: max(0, len(steps) - keep)]:
        try:
            fs.rm_file(name)
        except FileNotFoundError:
            pass
