"""The device mesh of a training run and how the batch and the state are laid out on it.

Every device of the run takes part: on a multi-host slice ``jax.devices()`` lists every
process's devices, so one mesh spans the whole slice. The batch is sharded along the
``"data"`` axis (``NamedSharding(mesh, P("data"))``); the state is replicated unless a
``state_sharding`` says otherwise (FSDP-style: :func:`fsdp_sharding`).

>>> mesh = make_mesh()                            # doctest: +SKIP  ("data": every device)
>>> mesh = make_mesh((4, 2), ("data", "model"))   # doctest: +SKIP

Each host builds its part of the global batch from its own rows
(:func:`process_rows`), and ``jax.make_array_from_process_local_data`` assembles the global
``jax.Array`` without moving data between hosts.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

# JAX is imported inside the functions: `import marin.tpu` must not need it.

__all__ = [
    "DATA_AXIS",
    "StateSharding",
    "batch_sharding",
    "check_batch_size",
    "fsdp_sharding",
    "make_mesh",
    "process_rows",
    "state_shardings",
]

DATA_AXIS = "data"
"""The mesh axis the batch is split along."""

StateSharding = Any
"""``None`` (replicated), a pytree of ``PartitionSpec``/``NamedSharding`` matching the state
(or a prefix of it), or a function ``abstract_state -> such a pytree``."""


def make_mesh(
    mesh_shape: Sequence[int] | None = None,
    axis_names: Sequence[str] = (DATA_AXIS,),
    *,
    devices: Sequence[Any] | None = None,
) -> Mesh:
    """A mesh over ``devices`` (default: every device of every process) named ``axis_names``.

    ``mesh_shape`` defaults to all devices on the first axis and 1 on the others; one entry
    may be ``-1`` (the devices left over).

    Raises:
        ValueError: ``axis_names`` lacks ``"data"``, has duplicates, or ``mesh_shape`` does
            not match the device count (the message gives both).
    """
    import jax

    devices = list(jax.devices() if devices is None else devices)
    names = tuple(axis_names)
    if DATA_AXIS not in names:
        raise ValueError(f"axis_names must include {DATA_AXIS!r} (the batch axis), got {names}")
    if len(set(names)) != len(names):
        raise ValueError(f"axis_names must be distinct, got {names}")
    shape = _resolve_shape(mesh_shape, names, len(devices))
    # jax.make_mesh orders the devices for the physical topology on TPUs (neighbours along
    # each axis share fast links); on the CPU it is a plain reshape. Auto axes: classic GSPMD
    # propagation, which is what a user's jitted train_step expects.
    return jax.make_mesh(shape, names, axis_types=(jax.sharding.AxisType.Auto,) * len(names), devices=devices)


def _resolve_shape(mesh_shape: Sequence[int] | None, names: tuple[str, ...], count: int) -> tuple[int, ...]:
    import jax

    if mesh_shape is None:
        return (count,) + (1,) * (len(names) - 1)
    shape = tuple(int(n) for n in mesh_shape)
    if len(shape) != len(names):
        raise ValueError(f"mesh_shape {shape} has {len(shape)} axes but axis_names {names} has {len(names)}")
    if shape.count(-1) > 1 or any(n == 0 or n < -1 for n in shape):
        raise ValueError(f"mesh_shape entries must be positive (one may be -1), got {shape}")
    if -1 in shape:
        known = math.prod(n for n in shape if n != -1)
        if count % known:
            raise ValueError(f"mesh_shape {shape} does not divide the {count} devices of this run")
        shape = tuple(count // known if n == -1 else n for n in shape)
    if math.prod(shape) != count:
        raise ValueError(
            f"mesh_shape {shape} has {math.prod(shape)} devices but this run has {count} "
            f"({jax.process_count()} process(es) x {jax.local_device_count()} local devices); "
            f"use shapes whose product is {count}, e.g. ({count},) or ({count // 2 or 1}, {2 if count % 2 == 0 else 1})"
        )
    return shape


def batch_sharding(mesh: Mesh) -> NamedSharding:
    """Rows split along ``"data"``, replicated along every other axis."""
    from jax.sharding import NamedSharding, PartitionSpec

    return NamedSharding(mesh, PartitionSpec(DATA_AXIS))


def check_batch_size(batch_size: int, mesh: Mesh) -> None:
    """Raise ``ValueError`` naming both numbers if ``batch_size`` does not split evenly."""
    data = mesh.shape[DATA_AXIS]
    if batch_size % data:
        raise ValueError(
            f"batch_size {batch_size} is not divisible by the {data} devices of the mesh's "
            f"{DATA_AXIS!r} axis (mesh {dict(mesh.shape)}); use a multiple of {data}"
        )


def process_rows(sharding: NamedSharding, global_shape: tuple[int, ...]) -> list[tuple[int, int]]:
    """This process's rows of a global array with ``sharding``, as sorted, merged ``[start, stop)``.

    These are the rows ``jax.make_array_from_process_local_data`` expects this process to
    supply, in this order: usually one contiguous block of ``batch_size / hosts`` rows, but
    a topology-ordered mesh may give a host several ranges.
    """
    rows = set()
    for index in sharding.addressable_devices_indices_map(global_shape).values():
        start, stop, _ = index[0].indices(global_shape[0])
        rows.add((start, stop))
    merged: list[tuple[int, int]] = []
    for start, stop in sorted(rows):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], stop))
        else:
            merged.append((start, stop))
    return merged


def state_shardings(state_sharding: StateSharding, abstract_state: Any, mesh: Mesh) -> Any:
    """A ``NamedSharding`` for every leaf of ``abstract_state`` (a pytree of ShapeDtypeStructs).

    Raises:
        ValueError: the given pytree does not match the state's structure.
    """
    import jax
    from jax.sharding import NamedSharding, PartitionSpec

    replicated = NamedSharding(mesh, PartitionSpec())
    if state_sharding is None:
        return jax.tree_util.tree_map(lambda _: replicated, abstract_state)
    if callable(state_sharding):
        with jax.sharding.use_abstract_mesh(mesh.abstract_mesh):  # fsdp_sharding reads the axis sizes
            spec_tree = state_sharding(abstract_state)
    else:
        spec_tree = state_sharding

    def to_sharding(spec, leaf):
        if spec is None:
            return replicated
        if isinstance(spec, NamedSharding):
            return spec
        if isinstance(spec, PartitionSpec):
            return NamedSharding(mesh, spec)
        raise TypeError(f"state_sharding leaves must be PartitionSpec, NamedSharding or None, got {spec!r}")

    is_spec = lambda x: x is None or isinstance(x, PartitionSpec | NamedSharding)  # noqa: E731
    try:
        # A prefix tree is allowed: one spec may cover a whole subtree (e.g. {"opt_state": P()}).
        return jax.tree_util.tree_map(
            lambda spec, subtree: jax.tree_util.tree_map(lambda leaf: to_sharding(spec, leaf), subtree),
            spec_tree, abstract_state, is_leaf=is_spec,
        )
    except ValueError as e:
        raise ValueError(f"state_sharding does not match the structure of the state: {e}") from e


def fsdp_sharding(axis: str = DATA_AXIS, min_size: int = 2**10) -> Callable[[Any], Any]:
    """A ``state_sharding`` that splits each large leaf along its biggest dimension over ``axis``.

    Leaves smaller than ``min_size`` elements, scalars, PRNG keys and leaves with no
    dimension divisible by the axis size stay replicated. Use it as
    ``train_loop(..., state_sharding=fsdp_sharding())``.
    """

    def specs(abstract_state: Any) -> Any:
        import jax

        return jax.tree_util.tree_map(lambda leaf: _fsdp_spec(leaf, axis, min_size), abstract_state)

    return specs


def _fsdp_spec(leaf: Any, axis: str, min_size: int) -> PartitionSpec:
    import jax
    from jax.sharding import PartitionSpec

    mesh = jax.sharding.get_abstract_mesh()
    size = mesh.shape.get(axis, 0) if not mesh.empty else 0
    shape = tuple(getattr(leaf, "shape", ()))
    dtype = getattr(leaf, "dtype", None)
    if dtype is not None and jax.dtypes.issubdtype(dtype, jax.dtypes.prng_key):
        return PartitionSpec()
    if not shape or math.prod(shape) < min_size or size < 2:
        return PartitionSpec()
    for dim in sorted(range(len(shape)), key=lambda d: -shape[d]):
        if shape[dim] % size == 0:
            return PartitionSpec(*([None] * dim + [axis]))
    return PartitionSpec()
