"""The earlier path of :mod:`marin.training.preemption` (kept so that existing imports work)."""

from marin.training.preemption import *  # noqa: F403
from marin.training.preemption import __all__  # noqa: F401
