"""Environment switches that turn one of zephyr's fast paths off, to compare it with the plain
path or to debug it: each is on unless set to 0, false, no or off."""

from __future__ import annotations

import os

__all__ = ["switched_on"]


def switched_on(name: str) -> bool:
    """Whether the environment leaves the switch `name` on (its default)."""
    return os.environ.get(name, "1").lower() not in ("0", "false", "no", "off")
