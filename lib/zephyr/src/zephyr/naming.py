"""How user functions are named in plans, errors and warnings."""

from __future__ import annotations

from collections.abc import Callable

__all__ = ["callable_name"]


def callable_name(fn: Callable) -> str:
    """A readable name for plans and errors: `normalize`, `<lambda at pipeline.py:12>`."""
    if hasattr(fn, "name_for_plan"):
        return fn.name_for_plan()
    name = getattr(fn, "__qualname__", None) or getattr(fn, "__name__", None) or type(fn).__name__
    if name.endswith("<lambda>"):
        code = getattr(fn, "__code__", None)
        if code is not None:
            return f"<lambda at {code.co_filename.rsplit('/', 1)[-1]}:{code.co_firstlineno}>"
    return name
