"""Per-task resource requests and their parsing ("2GB", "512MiB", bytes)."""

from __future__ import annotations

import re
from dataclasses import dataclass, field

__all__ = ["TaskResources", "parse_memory"]

_UNITS = {
    "": 1, "b": 1,
    "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9, "t": 10**12, "tb": 10**12,
    "ki": 2**10, "kib": 2**10, "mi": 2**20, "mib": 2**20, "gi": 2**30, "gib": 2**30, "ti": 2**40, "tib": 2**40,
}


def parse_memory(value: int | float | str | None) -> int | None:
    """Bytes from 2147483648, "2GB", "2 GiB", "512MiB", "1.5g"; None stays None.

    >>> parse_memory("2GB")
    2000000000
    >>> parse_memory("512MiB")
    536870912
    """
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError(f"memory must be a size like '2GB' or a number of bytes, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"memory must be positive, got {value!r}")
        return int(value)
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+)\s*([a-zA-Z]*)\s*", str(value))
    unit = match.group(2).lower() if match else None
    if not match or unit not in _UNITS:
        raise ValueError(f"memory must be a size like '2GB', '512MiB' or a number of bytes, got {value!r}")
    amount = int(float(match.group(1)) * _UNITS[unit])
    if amount <= 0:
        raise ValueError(f"memory must be positive, got {value!r}")
    return amount


@dataclass(frozen=True)
class TaskResources:
    """What each shard task asks the scheduler for. Local backends record but do not enforce them."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: dict = field(default_factory=dict)

    def __post_init__(self):
        if self.num_cpus < 0 or self.num_gpus < 0:
            raise ValueError(f"num_cpus and num_gpus must be >= 0, got {self.num_cpus}, {self.num_gpus}")
        object.__setattr__(self, "memory", parse_memory(self.memory))
        if not isinstance(self.resources, dict) or not all(
            isinstance(k, str) and isinstance(v, (int, float)) for k, v in self.resources.items()
        ):
            raise ValueError(f"resources must map names to amounts, e.g. {{'TPU': 4}}, got {self.resources!r}")
