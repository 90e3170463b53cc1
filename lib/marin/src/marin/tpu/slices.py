"""TPU generations, slice types, and the Ray resources that address them.

A Cloud TPU *slice* is named by its accelerator type, e.g. ``v4-8`` or ``v5litepod-16``. A
slice is one or more *hosts* (TPU VMs); every host of a slice joins the Ray cluster as its
own node. On such a node Ray advertises:

- ``TPU``: the number of chips on that host;
- ``TPU-<type>-head``: ``1``, on host 0 of the slice only;
- ``<slice name>``: ``1`` on every host of the slice (the TPU's instance name), plus the
  node label ``ray.io/tpu-slice-name`` with the same value.

A task that owns a whole slice therefore asks for the head resource (so it never grabs
part of a multi-host slice) and, from host 0, schedules one task per host on the slice-name
resource. This module is the table of valid types and the resource arithmetic; it imports
neither Ray nor JAX.

>>> spec = parse_tpu_type("v4-16")
>>> (spec.chips, spec.num_hosts, spec.chips_per_host, spec.head_resource)
(8, 2, 4, 'TPU-v4-16-head')
>>> tpu_resources("v4-8")
{'num_cpus': 1, 'resources': {'TPU': 4, 'TPU-v4-8-head': 1}}
"""

from __future__ import annotations

import re
from dataclasses import dataclass

__all__ = [
    "GENERATIONS",
    "HOST_ID_ENV",
    "NUM_HOSTS_ENV",
    "SLICE_ID_ENV",
    "TPU_RESOURCE",
    "TpuGeneration",
    "TpuSlice",
    "host_resources",
    "parse_tpu_type",
    "simulated_host",
    "tpu_head_resource",
    "tpu_resources",
    "valid_tpu_types",
]

# Environment each host task of `marin.tpu.runner.run_on_tpu` sees (besides MEGASCALE_* for
# multislice runs); here, without Ray, so that `train_loop` reads them on a host with no Ray.
HOST_ID_ENV = "MARIN_TPU_HOST_ID"
NUM_HOSTS_ENV = "MARIN_TPU_NUM_HOSTS"
SLICE_ID_ENV = "MARIN_TPU_SLICE_ID"

TPU_RESOURCE = "TPU"


@dataclass(frozen=True)
class TpuGeneration:
    """One TPU generation and the slice sizes it comes in.

    Attributes:
        name: the generation as people say it ("v4", "v5e").
        prefix: the prefix of its accelerator types ("v4", "v5litepod").
        sizes: the numbers that may follow the prefix, ascending.
        cores_per_chip: TensorCores per chip. For v4 and v5p the number in the type name
            counts cores (v4-8 is 4 chips); for v5e and v6e it counts chips.
        chips_per_host: chips on each host of a multi-host slice.
        max_single_host_chips: the largest slice that is a single host (its host carries
            all of its chips).
    """

    name: str
    prefix: str
    sizes: tuple[int, ...]
    cores_per_chip: int
    chips_per_host: int
    max_single_host_chips: int

    def types(self) -> tuple[str, ...]:
        """Every valid accelerator type of this generation, smallest first."""
        return tuple(f"{self.prefix}-{size}" for size in self.sizes)


def _powers_of_two(lo: int, hi: int) -> tuple[int, ...]:
    sizes, size = [], lo
    while size <= hi:
        sizes.append(size)
        size *= 2
    return tuple(sizes)


GENERATIONS: dict[str, TpuGeneration] = {
    generation.name: generation
    for generation in (
        TpuGeneration("v4", "v4", _powers_of_two(8, 4096), 2, 4, 4),
        TpuGeneration("v5e", "v5litepod", (1, 4, 8, 16, 32, 64, 128, 256), 1, 4, 8),
        TpuGeneration("v5p", "v5p", (*_powers_of_two(8, 8192), 12288), 2, 4, 4),
        TpuGeneration("v6e", "v6e", (1, 4, 8, 16, 32, 64, 128, 256), 1, 4, 8),
    )
}
"""The supported generations by name. v5e types are spelled ``v5litepod-N`` (``v5e-N`` is
accepted as an alias)."""

_BY_PREFIX = {generation.prefix: generation for generation in GENERATIONS.values()}
_ALIASES = {"v5e": "v5litepod"}


@dataclass(frozen=True)
class TpuSlice:
    """A parsed accelerator type: how many chips and hosts, and its Ray resource names."""

    tpu_type: str
    generation: TpuGeneration
    chips: int

    @property
    def is_multi_host(self) -> bool:
        return self.chips > self.generation.max_single_host_chips

    @property
    def chips_per_host(self) -> int:
        """Chips (the ``TPU`` resource) on each host of this slice."""
        return self.generation.chips_per_host if self.is_multi_host else self.chips

    @property
    def num_hosts(self) -> int:
        return self.chips // self.chips_per_host

    @property
    def head_resource(self) -> str:
        """The resource Ray puts on host 0 of a slice of this type, e.g. ``TPU-v4-8-head``."""
        return f"TPU-{self.tpu_type}-head"


def valid_tpu_types(generation: str | None = None) -> tuple[str, ...]:
    """All valid accelerator types, or those of one generation ("v4", "v5e", "v5p", "v6e")."""
    if generation is None:
        return tuple(t for g in GENERATIONS.values() for t in g.types())
    if generation not in GENERATIONS:
        raise ValueError(f"Unknown TPU generation {generation!r}; valid generations: {', '.join(GENERATIONS)}")
    return GENERATIONS[generation].types()


def parse_tpu_type(tpu_type: str) -> TpuSlice:
    """Parse an accelerator type such as ``"v4-8"``, ``"v5litepod-16"`` or ``"v6e-4"``.

    Raises:
        TypeError: if ``tpu_type`` is not a string.
        ValueError: if it is malformed, names an unknown generation, or a size that
            generation does not come in; the message lists the valid choices.
    """
    if not isinstance(tpu_type, str):
        raise TypeError(f"TPU type must be a string like 'v4-8', got {type(tpu_type).__name__}: {tpu_type!r}")
    prefix, sep, size_text = tpu_type.strip().lower().rpartition("-")
    if not sep or not prefix or not size_text.isdigit():
        raise ValueError(
            f"Malformed TPU type {tpu_type!r}: expected '<generation>-<size>' such as 'v4-8', "
            f"'v5litepod-4', 'v5p-8' or 'v6e-8'. Valid generations: {_generation_list()}"
        )
    prefix = _ALIASES.get(prefix, prefix)
    generation = _BY_PREFIX.get(prefix)
    if generation is None:
        raise ValueError(f"Unknown TPU generation {prefix!r} in {tpu_type!r}; valid generations: {_generation_list()}")
    size = int(size_text)
    if size not in generation.sizes:
        raise ValueError(
            f"Invalid size {size} for TPU generation {generation.name} in {tpu_type!r}; "
            f"valid {generation.name} types: {', '.join(generation.types())}"
        )
    chips = size // generation.cores_per_chip
    return TpuSlice(tpu_type=f"{generation.prefix}-{size}", generation=generation, chips=chips)


def _generation_list() -> str:
    return ", ".join(f"{g.name} ({g.prefix}-N)" if g.prefix != g.name else g.name for g in GENERATIONS.values())


def tpu_head_resource(tpu_type: str) -> str:
    """The Ray resource that only the head host of a `tpu_type` slice has: "v4-8" -> "TPU-v4-8-head".

    "v5e-N" is spelled "v5litepod-N" by Ray and GCP; both are accepted. The type is checked
    against the table of real slice types (:func:`parse_tpu_type`): "v4-12" is an error.
    """
    if not re.fullmatch(r"(v\d+[a-z]*|v5litepod)-(\d+)", tpu_type.strip().lower()):
        raise ValueError(f"TPU type must look like 'v4-8', 'v5e-16' or 'v6e-8'; got {tpu_type!r}")
    # Only real slice types: "v4-12" matches the pattern but no slice (or resource) has it.
    return parse_tpu_type(tpu_type).head_resource


def tpu_resources(tpu_type: str, *, num_cpus: float = 1) -> dict:
    """Ray options for a task on host 0 of a slice: all its chips plus the slice head.

    For a single-host slice this task owns the whole slice. For a multi-host slice it owns
    host 0 and the right to use the slice; run the other hosts' work with
    :func:`host_resources` (``run_on_tpu`` does both).

    >>> tpu_resources("v5litepod-8", num_cpus=8)
    {'num_cpus': 8, 'resources': {'TPU': 8, 'TPU-v5litepod-8-head': 1}}
    """
    spec = parse_tpu_type(tpu_type)
    return {"num_cpus": num_cpus, "resources": {TPU_RESOURCE: spec.chips_per_host, spec.head_resource: 1}}


def host_resources(tpu_type: str, slice_name: str, *, num_cpus: float = 1) -> dict:
    """Ray options for a task on one host of the named slice (all of that host's chips).

    >>> host_resources("v4-16", "my-slice")
    {'num_cpus': 1, 'resources': {'TPU': 4, 'my-slice': 1}}
    """
    spec = parse_tpu_type(tpu_type)
    if not slice_name:
        raise ValueError(f"slice_name must be a non-empty string, got {slice_name!r}")
    return {"num_cpus": num_cpus, "resources": {TPU_RESOURCE: spec.chips_per_host, slice_name: 1}}


def simulated_host(tpu_type: str) -> dict:
    """``ray.init`` options for a local Ray whose node poses as host 0 of a ``tpu_type`` slice.

    The node advertises the slice's ``TPU`` and head resources, and JAX in its workers runs
    on the CPU with one simulated device per chip, so the training adapter builds the same
    mesh it would on the host (4 devices for a v4-8). For examples and laptops:
    ``ray.init(address="local", **simulated_host("v4-8"))``.

    >>> simulated_host("v4-8")["resources"]
    {'TPU': 4, 'TPU-v4-8-head': 1}
    """
    spec = parse_tpu_type(tpu_type)
    env = {"JAX_PLATFORMS": "cpu", "XLA_FLAGS": f"--xla_force_host_platform_device_count={spec.chips_per_host}"}
    return {"resources": tpu_resources(tpu_type)["resources"], "runtime_env": {"env_vars": env}}
