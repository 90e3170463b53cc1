"""How a TPU run ends badly: the slice was lost too often, or the cluster cannot run it.

Kept apart from :mod:`marin.tpu.runner` (which imports Ray) so that the executor can tell a
lost slice from a failed step without importing Ray where no Ray runs.
"""

from __future__ import annotations

from zephyr.backends.ray_errors import is_lost

__all__ = ["TpuPreemptedError", "TpuSetupError", "is_preemption"]


class TpuPreemptedError(RuntimeError):
    """The slice was lost more often than ``max_retries_preemption`` allows."""


class TpuSetupError(RuntimeError):
    """The cluster cannot run this slice type as asked (not retried)."""


def is_preemption(error: BaseException, *, max_depth: int = 1) -> bool:
    """Whether ``error`` says that one of *our* nodes, workers or actors was lost.

    ``zephyr.backends.ray_errors.is_lost``, the classification Zephyr's Ray backend uses too
    (its docstring lists which Ray errors count, and why an OOM kill or a cancel does not).
    Only Ray errors near the top of the ``RayTaskError`` cause chain count: at depth 0 (the
    slice actor, or a Ray task the caller waited on, died) or, with the default
    ``max_depth=1``, depth 1 (a host task died, reported through the slice actor's method).
    A lost actor or object *inside* the user's own task error (``fn`` used actors of its own
    and one died: depth 2 under ``run_on_tpu``) is the user's failure, not a preemption.
    """
    return is_lost(error, max_depth=max_depth)
