"""A label for the runs a piece of code starts, shown by the status page and `zephyr status`.

An application that runs pipelines on behalf of something larger (Marin's executor runs them
inside experiment steps) wraps that code in `run_label("executor step tokenize")`; every
`Execution` created inside it (in the same thread or task context) carries the label. Zephyr
knows nothing of what the label names.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from contextvars import ContextVar

__all__ = ["current_label", "run_label"]

_label: ContextVar[str | None] = ContextVar("zephyr_run_label", default=None)


@contextlib.contextmanager
def run_label(text: str) -> Iterator[None]:
    """Label the runs created inside this block (nested blocks replace the label)."""
    token = _label.set(text)
    try:
        yield
    finally:
        _label.reset(token)


def current_label() -> str | None:
    return _label.get()
