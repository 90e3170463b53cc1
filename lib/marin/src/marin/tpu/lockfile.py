"""libtpu lockfile hygiene.

libtpu takes ``/tmp/libtpu_lockfile`` when a process opens the chips. Ray reuses worker
processes and a crashed or finished task can leave the file behind, and the next process on
that host then fails to open the TPU. Removing the file when a TPU task exits (success or
failure) avoids that. Tests and unusual hosts may point it elsewhere with the
``MARIN_LIBTPU_LOCKFILE`` environment variable or the ``path`` argument.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import os
from collections.abc import Callable
from typing import TypeVar, overload

__all__ = ["DEFAULT_LIBTPU_LOCKFILE", "libtpu_lockfile_path", "remove_tpu_lockfile", "remove_tpu_lockfile_on_exit"]

logger = logging.getLogger(__name__)

DEFAULT_LIBTPU_LOCKFILE = "/tmp/libtpu_lockfile"
LOCKFILE_ENV_VAR = "MARIN_LIBTPU_LOCKFILE"

F = TypeVar("F", bound=Callable)


def libtpu_lockfile_path() -> str:
    """The lockfile path on this host: ``$MARIN_LIBTPU_LOCKFILE`` or ``/tmp/libtpu_lockfile``."""
    return os.environ.get(LOCKFILE_ENV_VAR, DEFAULT_LIBTPU_LOCKFILE)


def remove_tpu_lockfile(path: str | None = None) -> bool:
    """Remove the libtpu lockfile if it exists; return whether a file was removed.

    Never raises for a missing file; a file that cannot be removed (permissions) is logged,
    because cleanup must not mask the task's own result or exception.
    """
    path = path or libtpu_lockfile_path()
    try:
        os.unlink(path)
        return True
    except FileNotFoundError:
        return False
    except OSError as e:
        logger.warning("could not remove libtpu lockfile %s: %s", path, e)
        return False


class _LockfileCleanup(contextlib.ContextDecorator):
    def __init__(self, path: str | None):
        self.path = path

    def __enter__(self):
        return self

    def __exit__(self, *exc_info):
        remove_tpu_lockfile(self.path)
        return False


@overload
def remove_tpu_lockfile_on_exit(fn: F, *, path: str | None = None) -> F: ...
@overload
def remove_tpu_lockfile_on_exit(fn: None = None, *, path: str | None = None) -> _LockfileCleanup: ...


def remove_tpu_lockfile_on_exit(fn=None, *, path=None):
    """Remove the libtpu lockfile when a function or block exits, however it exits.

    Use as a bare decorator, a decorator with arguments, or a context manager::

        @remove_tpu_lockfile_on_exit
        def train(): ...

        @remove_tpu_lockfile_on_exit(path="/tmp/other_lockfile")
        def train(): ...

        with remove_tpu_lockfile_on_exit():
            ...

    Args:
        fn: the function to wrap (when used as a bare decorator).
        path: the lockfile; default :func:`libtpu_lockfile_path` at exit time.
    """
    if fn is None:
        return _LockfileCleanup(path)
    if not callable(fn):
        raise TypeError(f"remove_tpu_lockfile_on_exit wraps a callable, got {type(fn).__name__}")

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        with _LockfileCleanup(path):
            return fn(*args, **kwargs)

    return wrapper
