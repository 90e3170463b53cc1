"""Package facades that load each name from its module on first use (PEP 562).

A facade built this way holds no import statement, so importing one of its light modules
(``marin.tpu.slices``) never pulls in the heavy ones (Ray, JAX), and no module of the package
reaches a sibling through the facade: imports keep flowing one way.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterable

__all__ = ["lazy_names"]


def lazy_names(
    package: str, table: dict[str, Iterable[str]]
) -> tuple[Callable[[str], object], Callable[[], list[str]], list[str]]:
    """``(__getattr__, __dir__, __all__)`` for `package`, given {module: the names it provides}.

    A loaded name is cached in the package's namespace, so each is looked up once.
    """
    where = {name: module for module, names in table.items() for name in names}

    # Each facade names its package and modules as string literals, so Zephyr's resume identity
    # (`zephyr.plan.code_reach`) follows them; the comments below tell it these imports add nothing.
    def __getattr__(name: str) -> object:
        if name not in where:
            raise AttributeError(f"module {package!r} has no attribute {name!r}")
        value = getattr(importlib.import_module(where[name]), name)  # zephyr: names listed
        setattr(importlib.import_module(package), name, value)  # zephyr: names listed
        return value

    def __dir__() -> list[str]:
        return sorted({*vars(importlib.import_module(package)), *where})  # zephyr: names listed

    return __getattr__, __dir__, sorted(where)
