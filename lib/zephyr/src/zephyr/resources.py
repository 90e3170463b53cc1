"""Per-task resource requests and their parsing ("2GB", "512MiB", bytes)."""

from __future__ import annotations

import argparse
import math
import re
from dataclasses import dataclass, field
from decimal import ROUND_FLOOR, Decimal

__all__ = ["TaskResources", "amount_argument", "format_bytes", "format_memory", "memory_argument", "parse_memory"]

_DECIMAL = {"k": 10**3, "m": 10**6, "g": 10**9, "t": 10**12, "p": 10**15}
_BINARY = {"k": 2**10, "m": 2**20, "g": 2**30, "t": 2**40, "p": 2**50}
_UNITS = {
    "": 1, "b": 1,
    **{prefix + suffix: n for prefix, n in _DECIMAL.items() for suffix in ("", "b")},
    **{prefix + suffix: n for prefix, n in _BINARY.items() for suffix in ("i", "ib")},
}
_SIZE = re.compile(r"\s*([+-]?(?:\d+(?:\.\d*)?|\.\d+)(?:e[+-]?\d+)?)\s*([a-z]*)\s*", re.IGNORECASE)
_EXAMPLE = "a size like '2GB', '512MiB', '512Mi', '1.5G' or a number of bytes"


def parse_memory(value: int | float | str | None) -> int | None:
    """Bytes from a memory size as users write it; None stays None.

    Accepts a positive number of bytes (int, float or digits) or a number with a unit,
    case-insensitive, with or without a space: decimal ``K``/``KB``, ``M``/``MB``, ``G``/``GB``,
    ``T``/``TB``, ``P``/``PB`` (powers of 1000) and binary ``Ki``/``KiB``, ``Mi``/``MiB``,
    ``Gi``/``GiB``, ``Ti``/``TiB``, ``Pi``/``PiB`` (powers of 1024; Kubernetes spells them
    ``Mi``). The arithmetic is exact (``"1.001GB"`` is 1001000000) and a fraction of a byte is
    dropped. Zero and negative sizes are errors: a budget of no memory is never what a user
    means, and Zephyr sizes its buffers from it; leave the option out to reserve nothing.

    Raises:
        ValueError: naming the value and what was expected.

    >>> parse_memory("2GB"), parse_memory("512Mi"), parse_memory("1.5g")
    (2000000000, 536870912, 1500000000)
    """
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, (int, float, str)):
        raise ValueError(f"memory must be {_EXAMPLE}; got {value!r} ({type(value).__name__})")
    if isinstance(value, float) and not math.isfinite(value):
        raise ValueError(f"memory must be {_EXAMPLE}; got {value!r}")
    if isinstance(value, str):
        match = _SIZE.fullmatch(value)
        if not match:
            raise ValueError(f"memory must be {_EXAMPLE}; got {value!r}")
        unit = match.group(2).lower()
        if unit not in _UNITS:
            raise ValueError(f"memory must be {_EXAMPLE}; got {value!r}, whose unit {match.group(2)!r} is not one of "
                             "B, K/KB/Ki/KiB, M/MB/Mi/MiB, G/GB/Gi/GiB, T/TB/Ti/TiB, P/PB/Pi/PiB")
        amount = Decimal(match.group(1)) * _UNITS[unit]
    else:
        amount = Decimal(repr(value))  # repr: the shortest decimal that is this float
    if amount <= 0:
        raise ValueError(f"memory must be positive, got {value!r}; leave it unset to reserve no memory")
    whole = int(amount.to_integral_value(rounding=ROUND_FLOOR))
    if whole <= 0:
        raise ValueError(f"memory must be at least one byte, got {value!r}")
    return whole


def format_memory(n: int) -> str:
    """Bytes as a user would write them, in the units `parse_memory` reads back exactly:
    binary when `n` is a whole number of MiB/GiB/TiB, else decimal ("2 GB", "512 MiB", "1.5 GB").

    >>> format_memory(2000000000), format_memory(536870912), format_memory(1500000000), format_memory(999)
    ('2 GB', '512 MiB', '1.5 GB', '999 B')
    """
    for unit, size in (("TiB", 1 << 40), ("GiB", 1 << 30), ("MiB", 1 << 20)):
        if n >= size and n % size == 0:
            return f"{n // size} {unit}"
    for unit, size in (("TB", 10**12), ("GB", 10**9), ("MB", 10**6), ("KB", 10**3)):
        if n >= size:
            whole, rest = divmod(n, size)
            return f"{whole} {unit}" if rest == 0 else f"{Decimal(n) / size:f}".rstrip("0").rstrip(".") + f" {unit}"
    return f"{n} B"


def memory_argument(text: str) -> int:
    """`parse_memory` as an argparse ``type=``: its message reaches the user (argparse
    replaces a plain ValueError's with "invalid value")."""
    try:
        return parse_memory(text)
    except ValueError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def amount_argument(text: str) -> float:
    """An argparse ``type=`` for an amount to reserve or price (CPUs, GPUs, a price): a finite
    number >= 0. -1 or NaN would reach Ray or the cost report and fail only after submission."""
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got {text!r}") from None
    if not math.isfinite(value) or value < 0:
        raise argparse.ArgumentTypeError(f"expected a finite number >= 0, got {text!r}")
    return value


@dataclass(frozen=True)
class TaskResources:
    """What each shard task asks the scheduler for. Local backends record but do not enforce them."""

    num_cpus: float = 1.0
    num_gpus: float = 0.0
    memory: int | None = None
    resources: dict = field(default_factory=dict)

    def __post_init__(self):
        # Checked here, before any task: Ray refuses NaN, infinite or negative amounts only when the
        # first task is submitted, with a traceback from its option checks; local backends never would.
        if not (_amount(self.num_cpus) and _amount(self.num_gpus)):
            raise ValueError(f"num_cpus and num_gpus must be finite numbers >= 0, got {self.num_cpus}, {self.num_gpus}")
        object.__setattr__(self, "memory", parse_memory(self.memory))
        if not isinstance(self.resources, dict) or not all(
            isinstance(k, str) and _amount(v) for k, v in self.resources.items()
        ):
            raise ValueError(f"resources must map names to amounts (finite numbers >= 0), e.g. {{'TPU': 4}}, got {self.resources!r}")


def _amount(value) -> bool:
    """A resource amount a scheduler can reserve: a finite number >= 0."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and value >= 0


def format_bytes(n: int | float) -> str:
    """An amount of data for people, in decimal units to one decimal ("412.0 MB"); see
    `format_memory` for a size a user can type back in."""
    value = float(n)
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(value) < 1000 or unit == "TB":
            return f"{value:.0f} {unit}" if unit == "B" else f"{value:.1f} {unit}"
        value /= 1000
    return f"{value:.1f} TB"
