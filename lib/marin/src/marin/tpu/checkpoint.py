"""The earlier path of :mod:`marin.training.checkpoint` (kept so that existing imports work)."""

from marin.training.checkpoint import *  # noqa: F403
from marin.training.checkpoint import __all__  # noqa: F401
