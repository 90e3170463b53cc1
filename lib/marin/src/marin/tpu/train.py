"""The earlier path of :mod:`marin.training.train` (kept so that existing imports work)."""

from marin.training.train import *  # noqa: F403
from marin.training.train import __all__  # noqa: F401
