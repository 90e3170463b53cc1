"""The earlier path of :mod:`marin.training.data` (kept so that existing imports work)."""

from marin.training.data import *  # noqa: F403
from marin.training.data import __all__  # noqa: F401
