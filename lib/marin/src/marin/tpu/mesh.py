"""The earlier path of :mod:`marin.training.mesh` (kept so that existing imports work)."""

from marin.training.mesh import *  # noqa: F403
from marin.training.mesh import __all__  # noqa: F401
